# One concept, 456 lines: one source's stream, its three tasks and what passes between
# them; its parts (pipeline, committer, speculator, partials, outbox) are modules of their own.
"""The session actor: one per live audio source, owning its socket for the stream's life.

Three tasks run under the actor:
- the reader receives frames and runs them through the source's `AudioPipeline`
  (decode → VAD → segmenter); what the segmenter says becomes `vad.*` messages,
  partial requests (`PartialSender`) and final requests (`Committer.submit`);
- the committer task commits the finals in utterance order (`Committer.commit`: the
  model's result, the meeting log, which gives it its `seq`, the client, the listeners);
- the writer sends queued messages to the client.

How a stream ends (session/ending.py) decides what is flushed: `stop`, a clean client
close and server shutdown finalize the utterance in progress; a dropped connection does
not (the client resumes and re-sends that audio). Finals already cut are always committed.

A `language=auto` stream detects its language once (session/language.py `LanguageGate`):
once it is pinned, it is stored with the source (a resume keeps it) and the client gets
one `session.language` message. A model that knows one language pins it at the start.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from dataclasses import dataclass, field
from typing import Any

from engine.api import SAMPLE_RATE, EngineDead, Priority, SchedulerStopped
from session.committer import Committer, CommitterConfig
from session.ending import (
    CLIENT_GONE,
    INTERNAL_ERROR,
    SHUTDOWN,
    STOPPED,
    SUPERSEDED,
    Ending,
    EndReason,
    commit_timeout,
    committer_failed,
    disconnected,
    first_ending,
    last_messages,
    refused,
    slow_consumer,
)
from session.enrolled import EnrolledVoices
from session.final_order import FinalizeAck, PendingFinal
from session.outbox import Outbox, OutboxDelivery, OutboxState
from session.partial_sender import PartialSender
from session.pipeline import seconds
from session.resume_context import OnResend, ResendLead, ResumeContext, stored_vad_state
from session.segmenter import (
    PartialDue,
    SegmentEvent,
    SpeechStarted,
    SpeechStopped,
    UtteranceEnded,
    UtteranceMayEnd,
    UtteranceResumed,
)
from session.services import SessionServices
from session.speakers import SpeakerLabeller
from session.speculation import Speculator
from session.stream_state import TRANSITIONS, Connection, SessionState, SessionTotals
from session.turns import TurnEvent, live_pipeline, turn_message
from store.cancel import cancel_and_wait
from store.errors import StoreError
from store.records import FinalRecord, SourceState
from wire import build, keyterms
from wire.codes import CloseCode, ErrorCode
from wire.control import ControlType, parse_control, parse_resend
from wire.errors import ProtocolError
from wire.messages import ServerMessage
from wire.query import StreamConfig

logger = logging.getLogger(__name__)

COMMIT_TIMEOUT = 60.0  # seconds the committer may take for the last finals of a stream
CLOSE_TIMEOUT = 5.0  # seconds a slow consumer gets for its last message; any client, the close


@dataclass(eq=False)  # identity semantics: actors live in sets
class SessionActor:
    """`source` is the stored state of this audio source when the stream starts: new, or read by a
    resume (then the stream's timeline starts at `source.acked_until` and `replay` holds the finals
    the client has not seen; its VAD goes on from the state stored with its last final; `context`
    names the logged utterances its next final is decoded behind, re-heard from the audio a client
    that sends `resend` re-sends from `send_from`). The committer keeps `source` current."""

    websocket: Connection
    config: StreamConfig
    services: SessionServices
    source: SourceState
    resume_token: str
    replay: list[FinalRecord] = field(default_factory=list)
    resumed: bool = False
    context: ResumeContext | None = None
    on_resend: OnResend | None = None  # told a `resend`'s lead, in seconds
    acknowledge_finalize: bool = False  # answer `finalize` with `finalize.done` (compat asks)
    # The tenant's enrolled voices (diarized sources name the ones that match).
    enrolled: EnrolledVoices | None = None
    state: SessionState = SessionState.CONNECTING

    def __post_init__(self) -> None:
        services, config = self.services, self.config
        self.session_id = self.source.session_id
        # The engine's key for this connection's requests: a resume on this node runs a
        # second connection of the source, and neither may cancel the other's requests.
        self.request_key = f"{self.session_id}/{self.source.generation}"
        self.start_sample = round(self.source.acked_until * SAMPLE_RATE)
        # The committer submits through it: a final that was speculated takes its result.
        self._speculator = Speculator(services.scheduler, services.telemetry, services.clock)
        self._pipeline = live_pipeline(  # its segmenter: partials, turn model and events
            services,
            config,
            start_sample=self.start_sample,
            first_index=self.source.next_utterance,
            vad_start=stored_vad_state(self.source) if self.resumed else None,
            speculated=self._speculator.transcription,
        )
        self._lead = ResendLead(self.context, self.on_resend)
        self._outbox = Outbox(
            services.outbox_limit,
            on_partial_dropped=lambda: services.telemetry.partial_dropped("merged"),
        )
        labeller = None
        if config.diarize and services.speakers is not None:
            labeller = SpeakerLabeller(services.speakers, services.diarizer, self.enrolled)
        self._committer = Committer(
            CommitterConfig.for_source(
                services,
                session_id=self.session_id,
                participant=config.participant,
                language=None if config.language == "auto" else config.language,
                live=True,
                request_key=self.request_key,
                keyterms=config.keyterms,
                text=config.text,
            ),
            self._speculator,
            services.store,
            self.source,
            OutboxDelivery(self._outbox),
            labeller,
        )
        if self.acknowledge_finalize:  # compat clients flush: they wait on each final
            self._flushes()
        self._partials = PartialSender(
            self._committer,
            self.meeting_id,
            services.scheduler,
            services.store,
            self._outbox,
            services.telemetry,
            services.clock,
        )
        self._finals: asyncio.Queue[PendingFinal | FinalizeAck | None] = asyncio.Queue()
        self._utterances = 0
        self._committed = 0  # utterances whose final was logged (or judged not speech)
        self._end_requested: Ending | None = None
        self._receiving = False
        self._reader: asyncio.Task[Ending] | None = None

    # ------------------------------------------------------------------ public

    @property
    def meeting_id(self) -> str:
        return self.config.meeting_id

    @property
    def totals(self) -> SessionTotals:
        return SessionTotals(
            audio_samples=self._pipeline.samples,
            utterances=self._utterances,
            finals=self._committer.finals,
            partials=self._partials.sent,
            partials_dropped=self._partials.dropped,
            empty_finals=self._committer.empty,
        )

    @property
    def outbox_state(self) -> OutboxState:
        """OVERFLOWED once the client is judged too slow (the stream is ending 1008)."""
        return self._outbox.state

    def request_shutdown(self) -> None:
        """Server shutdown: stop reading, finalize, send every final, close 1012."""
        self._request_end(SHUTDOWN)

    def supersede(self) -> None:
        """The source was resumed on another connection of this node: stop reading, drop
        what this connection still has queued (the new one re-sends that audio), close
        4409. Its requests are keyed by connection: they cannot touch the new one's."""
        self._request_end(SUPERSEDED)

    def _request_end(self, ending: Ending) -> None:
        if self._end_requested is None:
            self._end_requested = ending
        if self._receiving and self._reader is not None:
            self._reader.cancel()

    async def run(self) -> EndReason:
        """Serve the stream until it ends; returns why it ended."""
        self._transition(SessionState.STREAMING)
        ending: Ending | None = None
        tasks: list[asyncio.Task[Any]] = []
        try:
            try:
                opening = await self._opening()
            except StoreError as exc:  # the store is unreachable as the stream starts
                ending = committer_failed(exc)
                await self._send_error(ending)
                return ending.reason
            writer = asyncio.create_task(self._write(opening), name=f"writer-{self.session_id}")
            committer = asyncio.create_task(self._commit(), name=f"committer-{self.session_id}")
            self._reader = asyncio.create_task(self._read(), name=f"reader-{self.session_id}")
            overflow = asyncio.create_task(
                self._outbox.overflowed(), name=f"overflow-{self.session_id}"
            )
            tasks = [self._reader, writer, committer, overflow]
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            ending = await first_ending(done, self._reader, writer, committer, overflow)
            ending = await self._drain(ending, committer)
            if self._outbox.state is OutboxState.OVERFLOWED and ending.reason not in CLIENT_GONE:
                ending = slow_consumer(None)  # it overflowed while the last finals came
            if ending.reason in CLIENT_GONE:
                return ending.reason
            self._say_goodbye(ending)
            # A client that reads gets its last messages; one judged too slow, a moment.
            slow = ending.reason is EndReason.SLOW_CONSUMER
            await asyncio.wait({writer}, timeout=CLOSE_TIMEOUT if slow else COMMIT_TIMEOUT)
            return ending.reason
        except Exception:
            logger.exception("session %s failed", self.session_id)
            ending = INTERNAL_ERROR
            with contextlib.suppress(Exception):
                await self.websocket.send_text(
                    build.encode(build.error(ErrorCode.INTERNAL, "internal error; see server log"))
                )
            return ending.reason
        finally:
            self._speculator.withdraw()
            self.services.scheduler.cancel(self.request_key)
            await self._committer.close()
            tasks.extend(self._partials.tasks())
            await cancel_and_wait(tasks)  # a plain cancel may be dropped: store/cancel.py
            if ending is not None:  # counted before the close, which the client sees
                self.services.telemetry.session_closed(ending.reason.value, ending.close_code)
            if ending is not None and ending.reason not in CLIENT_GONE:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(CLOSE_TIMEOUT):  # a peer that reads nothing
                        await self.websocket.close(
                            ending.close_code, ending.close_reason(self.lost)
                        )
            self._transition(SessionState.CLOSED)

    async def _opening(self) -> list[str]:
        """What the client gets first: `session.started` (the meeting's last `seq` is read
        from the store) and, when pinned, `session.language`."""
        started = build.session_started(
            session_id=self.session_id,
            meeting_id=self.meeting_id,
            participant=self.config.participant,
            config=self.config.as_dict(),
            resume_token=self.resume_token,
            resume_from=self.start_sample / SAMPLE_RATE,
            resumed=self.resumed,
            last_seq=await self.services.store.last_seq(self.meeting_id),
            origin=self.source.origin,
            send_from=self.context.send_from if self.context is not None else None,
        )
        opening = [build.encode(started)]
        language = self._committer.language
        if self.config.language == "auto" and language is not None:
            opening.append(build.encode(build.session_language(language, None, 0)))
        return opening

    async def _drain(self, ending: Ending, committer: asyncio.Task[None]) -> Ending:
        """No more audio: finalize (if the ending says so) and commit what was cut, up to
        COMMIT_TIMEOUT. Returns the ending, changed if committing failed."""
        self._transition(SessionState.DRAINING)
        if ending is SUPERSEDED:  # its appends would be refused: nothing to wait for
            committer.cancel()
        elif ending.flush:  # the stream is over: drain the resampler too
            await self._handle(await self._pipeline.end())
        await self._finals.put(None)
        await asyncio.wait({committer}, timeout=COMMIT_TIMEOUT)
        if not committer.done():
            await cancel_and_wait([committer])
            if ending.reason is EndReason.STOP:  # the client asked for every final
                return commit_timeout(COMMIT_TIMEOUT)
        elif not committer.cancelled() and (failure := committer.exception()) is not None:
            return committer_failed(failure)  # a store failure, or the engine stopped or died
        return ending

    def _say_goodbye(self, ending: Ending) -> None:
        """The last messages: `session.ended` after `stop` or at shutdown (with the count
        of finals lost), `error` when the stream broke, then the outbox closes."""
        if ending.reason is EndReason.SLOW_CONSUMER and ending.error is not None:
            # It reads too slowly for its backlog: drop it (a resume replays the finals).
            self._outbox.close_with(build.encode(ending.error.to_message()))
            return
        for message in last_messages(ending, self.totals, self.lost):
            self._put(message)
        self._outbox.close()

    @property
    def lost(self) -> int:
        """Utterances cut whose final was neither logged nor sent."""
        return self._utterances - self._committed

    async def _send_error(self, ending: Ending) -> None:
        if ending.error is not None:
            with contextlib.suppress(Exception):
                await self.websocket.send_text(build.encode(ending.error.to_message()))

    # ------------------------------------------------------------------ reader

    async def _read(self) -> Ending:
        while True:
            if self._end_requested is not None:
                return self._end_requested
            self._receiving = True
            try:
                message = await self.websocket.receive()
            except asyncio.CancelledError:
                if self._end_requested is None:
                    raise
                current = asyncio.current_task()
                if current is not None:
                    current.uncancel()
                return self._end_requested
            except ProtocolError as exc:  # a limit the connection enforces (idle, duration)
                return refused(EndReason.LIMIT, exc)
            finally:
                self._receiving = False
            if message["type"] == "websocket.disconnect":
                return disconnected(message.get("code", 1005))
            try:
                ending = await self._receive(message)
            except ProtocolError as exc:
                return refused(EndReason.PROTOCOL_ERROR, exc)
            if ending is not None:
                return ending

    async def _receive(self, message: dict[str, Any]) -> Ending | None:
        data: bytes | None = message.get("bytes")
        text: str | None = message.get("text")
        size = len(data) if data is not None else len(text or "")
        if size > self.services.max_frame_bytes:
            raise ProtocolError(
                ErrorCode.FRAME_TOO_LARGE,
                CloseCode.MESSAGE_TOO_BIG,
                f"frame of {size} bytes exceeds the limit of {self.services.max_frame_bytes}",
            )
        if data is not None:
            events = await self._pipeline.decode(data)
            if (said := self._lead.heard(self._pipeline)) is not None:
                self._committer.hear_before(said)
            await self._handle(events)
            return None
        control = parse_control(text or "")
        if control is ControlType.CONFIGURE:  # for the utterances sent from now on
            self._committer.keyterms = keyterms.configure_keyterms(text or "")
        elif control is ControlType.RESEND:
            self._lead.resend(parse_resend(text or ""), self._pipeline)
        elif control is ControlType.STOP:
            return STOPPED
        elif control is ControlType.FINALIZE:
            received, cut = self.services.clock(), self._pipeline.cut()
            await self._handle(cut, flushed_at=received)
            self._flushes()  # after its cut: that final's speculation had context
            if self.acknowledge_finalize:
                ended = [e.index for e in cut if isinstance(e, UtteranceEnded)]
                last = f"{self.session_id}-{ended[-1]}" if ended else None
                await self._finals.put(FinalizeAck(last))
        return None  # keepalive: receiving it was the point

    def _flushes(self) -> None:
        """The client flushes: its finals go first (policy rules 1 and 3), no left context."""
        self._speculator.awaited = True
        self._committer.flushed()

    async def _handle(self, events: list[SegmentEvent], flushed_at: float | None = None) -> None:
        for event in events:
            if isinstance(event, SpeechStarted):
                utterance_id = f"{self.session_id}-{event.index}"
                self._put(build.speech_started(seconds(event.sample), utterance_id))
            elif isinstance(event, SpeechStopped):
                self._put(build.speech_stopped(seconds(event.sample)))
            elif isinstance(event, TurnEvent):
                self._put(turn_message(self.session_id, event))
            elif isinstance(event, PartialDue):
                await self._partials.submit(event)
            elif isinstance(event, UtteranceMayEnd):
                # Its partial (queued or running) would only delay the speculation, which
                # supersedes it.
                self.services.scheduler.cancel(self.request_key, only=Priority.PARTIAL)
                ask = functools.partial(self._partials.speculative, event)
                await self._speculator.speculate_when(self.request_key, ask)
            elif isinstance(event, UtteranceResumed):
                self._speculator.withdraw()
            elif isinstance(event, UtteranceEnded):
                self._utterances += 1
                # Its partial is stale now: queued, it would never run before this final
                # (finals outrank them); running, it would take the final's CPU.
                self.services.scheduler.cancel(self.request_key, only=Priority.PARTIAL)
                draft = self._partials.draft_for(event.index)
                pending = await self._committer.submit(event, draft)
                pending.vad_state = self._pipeline.vad_state_at(event.index)
                pending.flushed_at = flushed_at
                await self._finals.put(pending)
                self._speculator.withdraw()  # what the final did not take

    # ------------------------------------------------------------------ committer, writer

    async def _commit(self) -> None:
        while (pending := await self._finals.get()) is not None:
            if isinstance(pending, FinalizeAck):
                if self._outbox.state is OutboxState.OPEN:
                    self._put(build.finalize_done(pending.utterance_id))
                continue
            committed = await self._committer.commit(pending)
            if pending.flushed_at is not None:
                self._speculator.answered(pending.future, pending.flushed_at)
            await self._speculator.retry()  # one this final's prompt held up
            if isinstance(committed.lost, SchedulerStopped | EngineDead):
                raise committed.lost  # nothing more will be transcribed: end the stream
            if committed.lost is None:
                self._committed += 1
            elif self._outbox.state is OutboxState.OPEN:
                self._put(build.error(ErrorCode.INTERNAL, "an utterance could not be transcribed"))
        await self._committer.finish()  # the last speaker labels; an unsure detection pins

    async def _write(self, opening: list[str]) -> None:
        """Send the opening, the replay of the finals a resumed client missed (as fast as
        the client reads them: nothing piles up), then the outbox."""
        for first in opening:
            await self.websocket.send_text(first)
        for record in self.replay:
            await self.websocket.send_text(build.encode(build.transcript_final(record)))
        while (message := await self._outbox.get()) is not None:
            await self.websocket.send_text(message)

    def _put(self, message: ServerMessage) -> None:
        self._outbox.put(build.encode(message))

    def _transition(self, new: SessionState) -> None:
        if new not in TRANSITIONS[self.state]:
            raise RuntimeError(
                f"session {self.session_id}: illegal transition {self.state.value} → {new.value}"
            )
        self.state = new
