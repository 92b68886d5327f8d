"""The session actor: one per audio source, owning its socket for the stream's life.

Three tasks run under the actor:
- the reader receives frames, decodes audio, runs VAD and the segmenter, and submits
  partial and final requests to the shared scheduler;
- the committer awaits final results in utterance order, logs each final in the store
  (which gives it its `seq`), publishes it to listeners and queues it for the client;
- the writer sends queued messages to the client.

How a stream ends decides what is flushed: `stop`, a clean client close and server
shutdown finalize the utterance in progress; a dropped connection does not (the client
resumes and re-sends that audio). Finals already cut are always committed.

A `language=auto` stream detects its language once: its first final goes to the model
without a language, and the finals cut while that one is being recognized are held back.
The committer feeds the detected language to a `LanguageDetector`; once it pins one,
the held finals (and every request after them) carry it, it is stored with the source (a
resume keeps it), and the client gets one `session.language` message. While it is unsure,
the next held final is the next to detect on: one detection at a time per source. A
model that knows one language pins it at the start.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from engine.api import (
    SAMPLE_RATE,
    BatchFailed,
    Priority,
    Recognition,
    RecognitionRequest,
    RecognitionResult,
    RequestSuperseded,
    SchedulerError,
    SchedulerFull,
    SpeakerEmbedding,
    SpeakerWindows,
    Transcription,
    Utterance,
)
from session.audio import FrameDecoder
from session.diarizer import DiarizerConfig, Relabel
from session.language import LanguageDetector, LanguagePinned
from session.outbox import Outbox, OutboxState, SlowConsumer
from session.segmenter import (
    PartialDue,
    Segmenter,
    SegmenterConfig,
    SegmentEvent,
    SpeechStarted,
    SpeechStopped,
    UtteranceEnded,
)
from session.speakers import LabelledPart, SpeakerLabeller, relabel
from session.telemetry import NullTelemetry, Telemetry
from session.vad import VadScorer, VadStream
from store.api import Store
from store.errors import SourceSuperseded, StoreError
from store.records import FinalRecord, NewFinal, SourceState
from wire import build
from wire.codes import CloseCode, ErrorCode
from wire.control import ControlType, parse_control
from wire.errors import ProtocolError
from wire.messages import ServerMessage
from wire.query import StreamConfig

logger = logging.getLogger(__name__)

CONTEXT_CHARS = 400  # rolling text context kept per source
COMMIT_TIMEOUT = 60.0  # seconds the committer may take for the last finals of a stream


class Connection(Protocol):
    """What the actor needs of a WebSocket (Starlette's satisfies it)."""

    async def receive(self) -> Any: ...
    async def send_text(self, data: str) -> None: ...
    async def close(self, code: int = 1000, reason: str | None = None) -> None: ...


class SessionState(enum.Enum):
    CONNECTING = "connecting"
    STREAMING = "streaming"
    DRAINING = "draining"  # no more audio; finishing finals
    CLOSED = "closed"


_TRANSITIONS = {
    SessionState.CONNECTING: {SessionState.STREAMING, SessionState.CLOSED},
    SessionState.STREAMING: {SessionState.DRAINING, SessionState.CLOSED},
    SessionState.DRAINING: {SessionState.CLOSED},
    SessionState.CLOSED: set(),
}


class EndReason(enum.Enum):
    STOP = "stop"
    CLIENT_CLOSED = "client_closed"
    CONNECTION_LOST = "connection_lost"
    PROTOCOL_ERROR = "protocol_error"
    LIMIT = "limit"  # the connection's idle or duration limit
    SHUTDOWN = "shutdown"
    SLOW_CONSUMER = "slow_consumer"
    SUPERSEDED = "superseded"  # the source was resumed on another connection
    STORE_FAILED = "store_failed"
    INTERNAL_ERROR = "internal_error"


_CLIENT_GONE = {EndReason.CLIENT_CLOSED, EndReason.CONNECTION_LOST}


@dataclass(frozen=True, slots=True)
class Ending:
    reason: EndReason
    close_code: CloseCode
    flush: bool  # finalize the utterance in progress
    error: ProtocolError | None = None


@dataclass(frozen=True, slots=True)
class SessionServices:
    """Shared by every session; owned by the server's lifespan."""

    scheduler: Recognition
    store: Store
    vad: VadScorer
    segmenter: SegmenterConfig
    max_frame_bytes: int
    outbox_limit: int
    languages: frozenset[str]  # what the recognizer transcribes (`{'en'}`: English only)
    telemetry: Telemetry = field(default_factory=NullTelemetry)
    clock: Callable[[], float] = time.monotonic
    # Speaker embeddings for `diarize=true` sources; None: diarization is off.
    speakers: SpeakerEmbedding | None = None
    diarizer: DiarizerConfig = field(default_factory=DiarizerConfig)


@dataclass(slots=True)
class _PendingFinal:
    index: int
    start: int
    end: int
    # None while held back until the source's language is known (language=auto only).
    future: asyncio.Future[RecognitionResult] | None
    closed_at: float  # when the segmenter closed the utterance
    audio: Utterance
    # The utterance's speaker embeddings, computed beside its recognition (diarize=true).
    speakers: asyncio.Task[SpeakerWindows | None] | None = None


@dataclass(frozen=True, slots=True)
class _Finalized:
    """Queued behind the finals a `finalize` cut: the committer acknowledges it in order."""

    utterance_id: str | None


@dataclass
class SessionTotals:
    audio_samples: int = 0
    utterances: int = 0
    finals: int = 0
    partials: int = 0
    partials_dropped: int = 0
    empty_finals: int = 0  # utterances the hallucination guard judged not to be speech


@dataclass(eq=False)  # identity semantics: actors live in sets
class SessionActor:
    """`source` is the stored state of this audio source: new, or read by a resume (then
    the stream's timeline starts at `source.acked_until` and `replay` holds the finals
    the client has not seen)."""

    websocket: Connection
    config: StreamConfig
    services: SessionServices
    source: SourceState
    resume_token: str
    replay: list[FinalRecord] = field(default_factory=list)
    resumed: bool = False
    # Answer each `finalize` with an internal `finalize.done` (the compat adapters ask).
    acknowledge_finalize: bool = False
    state: SessionState = SessionState.CONNECTING
    totals: SessionTotals = field(default_factory=SessionTotals)

    def __post_init__(self) -> None:
        self.session_id = self.source.session_id
        self.start_sample = round(self.source.acked_until * SAMPLE_RATE)
        self.first_index = self.source.next_utterance
        segmenter_config = self.services.segmenter
        if not self.config.interim_results:
            segmenter_config = _without_partials(segmenter_config)
        self._decoder = FrameDecoder(self.config.encoding, self.config.sample_rate)
        self._vad = VadStream(self.services.vad)
        self._segmenter = Segmenter(
            segmenter_config, start_sample=self.start_sample, first_index=self.first_index
        )
        self._outbox = Outbox(
            self.services.outbox_limit,
            on_partial_dropped=lambda: self.services.telemetry.partial_dropped("merged"),
        )
        self._finals: asyncio.Queue[_PendingFinal | _Finalized | None] = asyncio.Queue()
        self._partial_tasks: set[asyncio.Task[None]] = set()
        self._committed_index = self.first_index - 1  # last utterance whose final was handled
        self._shutdown_requested = False
        self._receiving = False
        self._reader: asyncio.Task[Ending] | None = None
        self._language, self._detector = self._initial_language()
        self._detecting = False  # a final without a language is with the model
        self._held: list[_PendingFinal] = []  # finals cut meanwhile, in order
        self._telemetry = self.services.telemetry
        self._last_partial: tuple[int, float] | None = None  # (utterance index, sent at)
        # The latest partial text per utterance index: the next request's decoding draft.
        self._draft: tuple[int, str] = (-1, "")
        self._labeller = (
            SpeakerLabeller(self.services.speakers, self.services.diarizer)
            if self.config.diarize and self.services.speakers is not None
            else None
        )

    # ------------------------------------------------------------------ public

    @property
    def meeting_id(self) -> str:
        return self.config.meeting_id

    def request_shutdown(self) -> None:
        """Server shutdown: stop reading, finalize, send every final, close 1012."""
        self._shutdown_requested = True
        if self._receiving and self._reader is not None:
            self._reader.cancel()

    async def run(self) -> EndReason:
        """Serve the stream until it ends; returns why it ended."""
        self._transition(SessionState.STREAMING)
        last_seq = await self.services.store.last_seq(self.meeting_id)
        self._put(
            build.session_started(
                session_id=self.session_id,
                meeting_id=self.meeting_id,
                participant=self.config.participant,
                config=self.config.as_dict(),
                resume_token=self.resume_token,
                resume_from=self.start_sample / SAMPLE_RATE,
                resumed=self.resumed,
                last_seq=last_seq,
            )
        )
        if self.config.language == "auto" and self._language is not None:
            self._put(build.session_language(self._language, None, 0))
        for record in self.replay:
            self._outbox.put(
                build.encode(build.transcript_final(record)), utterance_id=record.utterance_id
            )
        writer = asyncio.create_task(self._write(), name=f"writer-{self.session_id}")
        committer = asyncio.create_task(self._commit(), name=f"committer-{self.session_id}")
        self._reader = asyncio.create_task(self._read(), name=f"reader-{self.session_id}")
        ending: Ending | None = None
        try:
            done, _ = await asyncio.wait(
                {self._reader, writer, committer}, return_when=asyncio.FIRST_COMPLETED
            )
            ending = await self._ending(done, writer, committer)
            self._transition(SessionState.DRAINING)
            if ending.flush:  # the stream is over: drain the resampler too
                await self._handle(await self._audio_events(self._decoder.flush()))
                await self._handle(self._flush_events())
            await self._finals.put(None)
            await asyncio.wait({committer}, timeout=COMMIT_TIMEOUT)
            if committer.done() and (failure := committer.exception()) is not None:
                ending = _committer_ending(failure)  # a store failure while draining
            if ending.reason in _CLIENT_GONE:
                return ending.reason
            if ending.error is not None:
                self._put(build.error(ending.error.code, ending.error.message))
            if ending.reason in {EndReason.STOP, EndReason.SHUTDOWN}:
                self._put(
                    build.session_ended(
                        reason=ending.reason.value,
                        audio_seconds=round(self.totals.audio_samples / SAMPLE_RATE, 3),
                        utterances=self.totals.utterances,
                        finals=self.totals.finals,
                    )
                )
            self._outbox.close()
            await asyncio.wait({writer}, timeout=COMMIT_TIMEOUT)
            return ending.reason
        except Exception:
            logger.exception("session %s failed", self.session_id)
            ending = Ending(EndReason.INTERNAL_ERROR, CloseCode.INTERNAL_ERROR, flush=False)
            with contextlib.suppress(Exception):
                await self.websocket.send_text(
                    build.encode(build.error(ErrorCode.INTERNAL, "internal error; see server log"))
                )
            return ending.reason
        finally:
            self.services.scheduler.cancel(self.session_id)
            if self._labeller is not None:
                await self._labeller.close()
            tasks = [t for t in (self._reader, writer, committer, *self._partial_tasks) if t]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if ending is not None:  # counted before the close, which the client sees
                self._telemetry.session_closed(ending.reason.value, ending.close_code)
            if ending is not None and ending.reason not in _CLIENT_GONE:
                with contextlib.suppress(Exception):
                    await self.websocket.close(ending.close_code, ending.reason.value)
            self._transition(SessionState.CLOSED)

    # ------------------------------------------------------------------ how it ends

    async def _ending(
        self,
        done: set[asyncio.Task[Any]],
        writer: asyncio.Task[None],
        committer: asyncio.Task[None],
    ) -> Ending:
        assert self._reader is not None
        if self._reader in done:
            return self._reader.result()
        # The writer or committer ended first: the client is gone or too slow, or a bug.
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)
        task = writer if writer in done else committer
        error = task.exception()
        if task is committer and error is not None:
            return _committer_ending(error)
        if isinstance(error, SlowConsumer):
            return Ending(
                EndReason.SLOW_CONSUMER,
                CloseCode.POLICY_VIOLATION,
                flush=True,
                error=ProtocolError(
                    ErrorCode.SLOW_CONSUMER, CloseCode.POLICY_VIOLATION, str(error)
                ),
            )
        if task is writer:  # send failed: the connection is gone
            return Ending(EndReason.CONNECTION_LOST, CloseCode.GOING_AWAY, flush=False)
        raise RuntimeError("committer ended before the stream") from error

    # ------------------------------------------------------------------ reader

    async def _read(self) -> Ending:
        while True:
            if self._shutdown_requested:
                return Ending(EndReason.SHUTDOWN, CloseCode.SERVICE_RESTART, flush=True)
            self._receiving = True
            try:
                message = await self.websocket.receive()
            except asyncio.CancelledError:
                if not self._shutdown_requested:
                    raise
                current = asyncio.current_task()
                if current is not None:
                    current.uncancel()
                return Ending(EndReason.SHUTDOWN, CloseCode.SERVICE_RESTART, flush=True)
            except ProtocolError as exc:  # a limit the connection enforces (idle, duration)
                return Ending(EndReason.LIMIT, exc.close_code, flush=True, error=exc)
            finally:
                self._receiving = False
            if message["type"] == "websocket.disconnect":
                code = message.get("code", 1005)
                if code in (CloseCode.NORMAL, CloseCode.GOING_AWAY):
                    return Ending(EndReason.CLIENT_CLOSED, CloseCode.NORMAL, flush=True)
                return Ending(EndReason.CONNECTION_LOST, CloseCode.GOING_AWAY, flush=False)
            try:
                ending = await self._receive(message)
            except ProtocolError as exc:
                return Ending(EndReason.PROTOCOL_ERROR, exc.close_code, flush=True, error=exc)
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
            await self._handle(await self._audio_events(self._decoder.decode(data)))
            return None
        control = parse_control(text or "")
        if control is ControlType.STOP:
            return Ending(EndReason.STOP, CloseCode.NORMAL, flush=True)
        if control is ControlType.FINALIZE:
            flushed = self._flush_events()
            await self._handle(flushed)
            if self.acknowledge_finalize:
                cut = [e.index for e in flushed if isinstance(e, UtteranceEnded)]
                await self._finals.put(_Finalized(self._utterance_id(cut[-1]) if cut else None))
        return None  # keepalive: receiving it was the point

    async def _audio_events(self, samples: np.ndarray[Any, Any]) -> list[SegmentEvent]:
        self.totals.audio_samples += len(samples)
        started = time.perf_counter()
        events: list[SegmentEvent] = []
        scored = await self._vad.process(samples)
        for window, probability in scored:
            events.extend(self._segmenter.push(window, probability))
        self._telemetry.vad_processed(time.perf_counter() - started, len(scored))
        return events

    def _flush_events(self) -> list[SegmentEvent]:
        return self._segmenter.flush()

    async def _handle(self, events: list[SegmentEvent]) -> None:
        for event in events:
            if isinstance(event, SpeechStarted):
                self._put(build.speech_started(_seconds(event.sample)))
            elif isinstance(event, SpeechStopped):
                self._put(build.speech_stopped(_seconds(event.sample)))
            elif isinstance(event, PartialDue):
                await self._submit_partial(event)
            elif isinstance(event, UtteranceEnded):
                await self._submit_final(event)

    async def _submit_partial(self, event: PartialDue) -> None:
        # Every partial the segmenter proposes goes to the scheduler, which keeps the
        # newest per session and spends the partials' share of the model on the
        # stalest sessions first: under load, every stream's partials slow down alike.
        request = RecognitionRequest(
            self.session_id,
            Priority.PARTIAL,
            Utterance(event.audio, self._language, self._draft_for(event.index)),
        )
        try:
            future = await self.services.scheduler.submit(request)
        except SchedulerFull:
            self._drop_partial("queue_full")
            return
        task = asyncio.create_task(self._deliver_partial(event, future))
        self._partial_tasks.add(task)
        task.add_done_callback(self._partial_tasks.discard)

    async def _deliver_partial(
        self, event: PartialDue, future: asyncio.Future[RecognitionResult]
    ) -> None:
        try:
            result = await future
        except RequestSuperseded:
            self._drop_partial("superseded")
            return
        except asyncio.CancelledError:
            self._drop_partial("stale")
            raise
        except SchedulerError:
            self._drop_partial("failed")
            logger.warning("partial of session %s failed", self.session_id, exc_info=True)
            return
        text = result.transcription.text.strip()
        if event.index <= self._committed_index or not text:
            self._drop_partial("stale")
            return
        self._draft = (event.index, text)
        message = build.transcript_partial(
            utterance_id=self._utterance_id(event.index),
            participant=self.config.participant,
            text=text,
            start=_seconds(event.start),
            end=_seconds(event.end),
        )
        payload = build.encode(message)
        if self._outbox.state is OutboxState.OPEN:
            self._outbox.put_partial(message["utterance_id"], payload)
        self.totals.partials += 1
        now = self.services.clock()
        previous = self._last_partial
        since = now - previous[1] if previous and previous[0] == event.index else None
        self._last_partial = (event.index, now)
        self._telemetry.partial_sent(since)
        await self.services.store.publish(self.meeting_id, payload.encode())

    async def _submit_final(self, event: UtteranceEnded) -> None:
        self.totals.utterances += 1
        # A queued partial would never run before this final (finals outrank partials).
        self.services.scheduler.cancel(self.session_id, partials_only=True)
        utterance = Utterance(event.audio, self._language, self._draft_for(event.index))
        pending = _PendingFinal(
            event.index, event.start, event.end, None, self.services.clock(), utterance
        )
        if self._labeller is not None:
            pending.speakers = self._labeller.embed(event.audio)
        if self._language is None and self._detecting:
            self._held.append(pending)  # its language comes from the detection under way
        else:
            self._detecting = self._language is None
            await self._submit(pending)
            pending.closed_at = self.services.clock()
        await self._finals.put(pending)

    def _draft_for(self, index: int) -> str:
        """The latest partial text of utterance `index`, or nothing."""
        drafted, text = self._draft
        return text if drafted == index else ""

    async def _submit(self, pending: _PendingFinal) -> None:
        request = RecognitionRequest(self.session_id, Priority.FINAL, pending.audio)
        pending.future = await self.services.scheduler.submit(request)

    # ------------------------------------------------------------------ committer

    async def _commit(self) -> None:
        while (pending := await self._finals.get()) is not None:
            if isinstance(pending, _Finalized):
                if self._outbox.state is OutboxState.OPEN:
                    self._put(build.finalize_done(pending.utterance_id))
                continue
            result = await self._result(pending)
            self._committed_index = pending.index  # its partials are stale from now on
            if pending.audio.language is None and self._detector is not None:
                await self._detected(result)
            if result is None:
                continue
            if not result.transcription.text.strip():
                self.totals.empty_finals += 1
                continue
            for part in await self._parts(pending, result.transcription):
                await self._log_final(pending, result, part)
            if self._labeller is not None:
                await self._relabel(await self._labeller.recluster())
        if self._labeller is not None:  # the stream is over: its best labelling
            await self._relabel(await self._labeller.recluster(final=True))
        # A stream that ended before its detection was sure reports the best it heard.
        if (
            self._detector is not None
            and self._language is None
            and (pinned := self._detector.decide()) is not None
        ):
            self._pin(pinned)

    async def _parts(
        self, pending: _PendingFinal, transcription: Transcription
    ) -> list[LabelledPart]:
        """The finals one recognized utterance makes: itself, or (diarize=true) one per
        speaker in it, each labelled."""
        utterance_id = self._utterance_id(pending.index)
        if self._labeller is None or pending.speakers is None:
            whole = LabelledPart(
                utterance_id,
                0,
                pending.end - pending.start,
                transcription.text.strip(),
                transcription.words,
                "",
                transcription.language,
            )
            return [whole]
        return await self._labeller.label(
            utterance_id,
            pending.start / SAMPLE_RATE,
            pending.audio.audio,
            await pending.speakers,
            transcription,
            lambda audio: self._recognize_part(audio, transcription.language),
        )

    async def _recognize_part(
        self, audio: np.ndarray[Any, Any], language: str
    ) -> Transcription | None:
        """Transcribe one speaker's part of an utterance on its own (at final priority)."""
        request = RecognitionRequest(self.session_id, Priority.FINAL, Utterance(audio, language))
        try:
            result = await (await self.services.scheduler.submit(request))
        except SchedulerError:
            logger.warning("a part of session %s failed", self.session_id, exc_info=True)
            return None
        return result.transcription

    async def _log_final(
        self, pending: _PendingFinal, result: RecognitionResult, part: LabelledPart
    ) -> None:
        """Log one final in the store (its `seq`), send it to the client and listeners."""
        start, end = pending.start + part.start, pending.start + part.end
        acked = dataclasses.replace(
            self.source,
            acked_until=end / SAMPLE_RATE,  # exact: resume re-sends from here
            next_utterance=pending.index + 1,
            context=(self.source.context + " " + part.text)[-CONTEXT_CHARS:].strip(),
            language=self._language,
        )
        record = await self.services.store.append_final(
            self.meeting_id,
            NewFinal(
                utterance_id=part.utterance_id,
                session_id=self.session_id,
                participant=self.config.participant,
                text=part.text,
                start=_seconds(start),
                end=_seconds(end),
                language=part.language,
                speaker=part.speaker or None,
            ),
            acked,
        )
        self.source = acked
        self.totals.finals += 1
        total = self.services.clock() - pending.closed_at
        message = build.transcript_final(
            record, build.timing(queue=result.queue_wait, inference=result.inference, total=total)
        )
        self._telemetry.final_sent(total)
        payload = build.encode(message)
        if self._outbox.state is OutboxState.OPEN:
            self._outbox.put(payload, utterance_id=part.utterance_id)
        await self.services.store.publish(self.meeting_id, payload.encode())

    async def _relabel(self, relabels: list[Relabel]) -> None:
        """Announce speakers a re-clustering changed, to the client and the listeners."""
        for message in await relabel(self.services.store, self.meeting_id, relabels):
            if self._outbox.state is OutboxState.OPEN:
                self._put(message)
            await self.services.store.publish(self.meeting_id, build.encode(message).encode())

    # ------------------------------------------------------------------ language

    def _initial_language(self) -> tuple[str | None, LanguageDetector | None]:
        """The language to pin from the start, or None and a detector (`language=auto`)."""
        if self.config.language != "auto":
            return self.config.language, None
        if self.source.language is not None:  # a resumed source detected it before
            return self.source.language, None
        if len(self.services.languages) == 1:  # an English-only model
            return next(iter(self.services.languages)), None
        return None, LanguageDetector()

    async def _detected(self, result: RecognitionResult | None) -> None:
        """A final sent without a language came back: feed its language to the detector
        (when it is speech), then release the finals held behind it."""
        assert self._detector is not None
        if (
            self._language is None
            and result is not None
            and result.transcription.text.strip()
            and (probability := result.transcription.language_probability) is not None
        ):
            pinned = self._detector.observe(result.transcription.language, probability)
            if pinned is not None:
                self._pin(pinned)
        if self._language is None:  # still unsure: the next final detects
            released, self._held = self._held[:1], self._held[1:]
            self._detecting = bool(released)
        else:
            released, self._held = self._held, []
        for pending in released:
            pending.audio = dataclasses.replace(pending.audio, language=self._language)
            await self._submit(pending)

    def _pin(self, pinned: LanguagePinned) -> None:
        self._language = pinned.language
        logger.info(
            "session %s: language %s (p=%.2f over %d utterances)",
            self.session_id,
            pinned.language,
            pinned.probability,
            pinned.utterances,
        )
        if self._outbox.state is OutboxState.OPEN:
            self._put(
                build.session_language(
                    pinned.language, round(pinned.probability, 4), pinned.utterances
                )
            )

    async def _result(self, pending: _PendingFinal) -> RecognitionResult | None:
        """Await a final's result; a failed batch is retried once before the final is lost."""
        if pending.future is None:
            raise RuntimeError(f"final {pending.index} reached the committer unsubmitted")
        try:
            return await pending.future
        except BatchFailed:
            logger.warning("final batch failed for session %s; retrying", self.session_id)
        request = RecognitionRequest(self.session_id, Priority.FINAL, pending.audio)
        try:
            return await (await self.services.scheduler.submit(request))
        except SchedulerError:
            logger.exception("final of session %s lost after retry", self.session_id)
            if self._outbox.state is OutboxState.OPEN:
                self._put(build.error(ErrorCode.INTERNAL, "an utterance could not be transcribed"))
            return None

    # ------------------------------------------------------------------ writer

    async def _write(self) -> None:
        while (message := await self._outbox.get()) is not None:
            await self.websocket.send_text(message)

    # ------------------------------------------------------------------ helpers

    def _drop_partial(self, reason: str) -> None:
        self.totals.partials_dropped += 1
        self._telemetry.partial_dropped(reason)

    def _put(self, message: ServerMessage) -> None:
        self._outbox.put(build.encode(message))

    def _utterance_id(self, index: int) -> str:
        return f"{self.session_id}-{index}"

    def _transition(self, new: SessionState) -> None:
        if new not in _TRANSITIONS[self.state]:
            raise RuntimeError(
                f"session {self.session_id}: illegal transition {self.state.value} → {new.value}"
            )
        self.state = new


def _committer_ending(error: BaseException) -> Ending:
    """How a stream ends when logging a final failed."""
    if isinstance(error, SourceSuperseded):
        return Ending(
            EndReason.SUPERSEDED,
            CloseCode.CONFLICT,
            flush=False,
            error=ProtocolError(
                ErrorCode.CONFLICT,
                CloseCode.CONFLICT,
                "this source was resumed on another connection",
            ),
        )
    if isinstance(error, StoreError):
        return Ending(
            EndReason.STORE_FAILED,
            CloseCode.TRY_AGAIN_LATER,
            flush=False,
            error=ProtocolError(
                ErrorCode.OVERLOADED,
                CloseCode.TRY_AGAIN_LATER,
                f"meeting store unavailable ({error}); resume later from resume_from",
            ),
        )
    raise RuntimeError("committer failed") from error


def _seconds(sample: int) -> float:
    return round(sample / SAMPLE_RATE, 3)


def _without_partials(config: SegmenterConfig) -> SegmenterConfig:
    return dataclasses.replace(config, partial_interval=0.0)
