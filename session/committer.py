"""The committer: one source's finals, from the cut utterance to the meeting log.

The live actor and the file transcriber both hand every utterance the segmenter ends to
`Committer.submit`, and later `commit` them in the order they were cut:

- `submit` sends the final's request to the engine in the source's language (and, for
  a diarized source, starts embedding its speakers beside it). A source whose language
  is to be detected goes through its `LanguageGate`: one final detects at a time and the
  finals cut meanwhile are held, then sent in the language it pinned.
- `commit` awaits the result (a failed batch is retried once; when the retry fails too,
  the final is lost and `Committed.lost` says why), feeds a detection to the gate, skips
  what the hallucination guard emptied, cuts a diarized utterance at speaker changes, and
  appends each final to the meeting log with the source's next state (audio
  acknowledged, next utterance, rolling context, language) in one store step; the store
  gives it its `seq`. Its message goes to the caller's `Delivery` (the live client, a
  file's result), then to the meeting's listeners. A file that stands alone (no meeting
  source) numbers its finals itself.

When a final goes to the engine, with which prompt and left context, and how long it
waits for the one before it, is session/final_order.py's (`FinalOrder`); how a result
becomes finals in the log, cut at speaker changes and relabelled, session/final_log.py's
(`FinalLog`).

A final's request is keyed by the committer's `request_key`: one per connection (a live
source that is resumed on the same node has two connections for a moment, and neither
may cancel the other's requests), the source's `session_id` for a file.
`Recognition.cancel(request_key)` drops whatever this connection still has queued.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from engine.api import (
    BatchFailed,
    EngineDead,
    Priority,
    Recognition,
    RecognitionRequest,
    RecognitionResult,
    SchedulerError,
    SchedulerStopped,
    Transcription,
    Utterance,
)
from session.final_log import Delivery, FinalLog
from session.final_order import FinalOrder, PendingFinal
from session.language import LanguageGate, LanguagePinned
from session.pipeline import FloatArray
from session.said_before import SaidBefore
from session.segmenter import UtteranceEnded, UtteranceMayEnd
from session.services import SessionServices
from session.speakers import SpeakerLabeller
from session.telemetry import NullTelemetry, Telemetry
from session.text_filter import TextFilter
from store.api import Store
from store.records import FinalRecord, SourceState
from wire import build
from wire.text_options import PLAIN, TextOptions

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Committed:
    """What became of one final."""

    result: RecognitionResult | None  # None: lost
    records: list[FinalRecord]  # empty: lost, or the guard judged it not speech
    lost: SchedulerError | None = None  # why the final was lost (its retry failed too)


@dataclass(frozen=True, slots=True)
class CommitterConfig:
    """Who the finals are from and how they travel."""

    session_id: str  # prefix of every utterance id
    participant: str
    priority: Priority  # FINAL for a live source, FILE for an upload
    timing: bool  # put the server's timings in each final's message (live)
    requested_language: str | None  # None: detect (language=auto)
    model_languages: frozenset[str]
    prompts: bool = False  # decode each final after the source's previous finals' text
    # Most seconds of the previous utterance (and the gap) heard before each final; 0: off.
    left_context: float = 0.0
    # Keep the left context once the client has flushed (False: its later finals go without).
    context_after_flush: bool = False
    # Most seconds a final waits for the one before it (for its prompt or left context)
    # before it is sent without them; None: until that one is committed.
    context_wait: float | None = None
    # The languages whose finals carry left context; None: every language.
    context_languages: frozenset[str] | None = None
    clock: Callable[[], float] = time.monotonic
    telemetry: Telemetry = field(default_factory=NullTelemetry)
    # The engine's key for this connection's requests (None: the session_id).
    request_key: str | None = None
    # Words the source expects (`Utterance.keyterms`); a stream's `configure` replaces
    # them (`Committer.keyterms`).
    keyterms: tuple[str, ...] = ()
    # What the client asked of the text (redaction, numerals, profanity): applied to
    # every final and partial before it is logged or sent (session/text_filter.py).
    text: TextOptions = PLAIN

    @classmethod
    def for_source(
        cls,
        services: SessionServices,
        *,
        session_id: str,
        participant: str,
        language: str | None,
        live: bool,
        request_key: str | None = None,
        keyterms: tuple[str, ...] = (),
        text: TextOptions = PLAIN,
    ) -> CommitterConfig:
        """The committer of a live source (`live`) or of a file, from the services both
        share: the same prompts, left context and languages. A live one also times its
        finals, bounds its wait for the final before (context_wait) and reports to the
        telemetry; a file's finals wait for theirs and outrank nothing live."""
        return cls(
            session_id=session_id,
            participant=participant,
            priority=Priority.FINAL if live else Priority.FILE,
            timing=live,
            requested_language=language,
            model_languages=services.languages,
            prompts=services.prompts,
            left_context=services.left_context,
            context_after_flush=services.context_after_flush,
            context_wait=services.context_wait if live else None,
            context_languages=services.context_languages,
            clock=services.clock,
            telemetry=services.telemetry if live else NullTelemetry(),
            request_key=request_key,
            keyterms=keyterms,
            text=text,
        )

    @property
    def engine_key(self) -> str:
        return self.request_key or self.session_id


class Committer:
    def __init__(
        self,
        config: CommitterConfig,
        recognition: Recognition,
        store: Store,
        source: SourceState | None,
        delivery: Delivery,
        labeller: SpeakerLabeller | None = None,
    ) -> None:
        """`source`: the meeting source the finals are logged as (None: a file that
        stands alone). `labeller`: the source's speaker labels (diarized sources)."""
        if source is not None and source.session_id != config.session_id:
            raise ValueError("a committer logs as its source: session ids must agree")
        self.config = config
        self._recognition = recognition
        self._delivery = delivery
        self._labeller = labeller
        self.gate: LanguageGate[PendingFinal] = LanguageGate(
            config.requested_language,
            source.language if source is not None else None,
            config.model_languages,
        )
        self._order = FinalOrder(
            self.gate,
            self._submit,
            prompts=config.prompts,
            left_context=config.left_context,
            context_wait=config.context_wait,
            context_languages=config.context_languages,
            clock=config.clock,
            context=source.context if source is not None else "",
        )
        self._log = FinalLog(
            store,
            source,
            delivery,
            labeller,
            session_id=config.session_id,
            participant=config.participant,
            timing=config.timing,
            clock=config.clock,
            telemetry=config.telemetry,
        )
        # The keyterms every utterance is sent with from now on (a `configure` sets them).
        self.keyterms: tuple[str, ...] = config.keyterms
        self.text_filter = TextFilter(config.text)  # the partials' too
        self.committed_index = -1  # the last utterance whose final was handled
        self.empty = 0  # utterances the hallucination guard judged not to be speech

    @property
    def language(self) -> str | None:
        return self.gate.language

    @property
    def finals(self) -> int:
        """Finals logged so far."""
        return self._log.finals

    def hear_before(self, said: SaidBefore) -> None:
        """A resumed source's last utterances, heard again (session.resume_context)."""
        self._order.hear_before(said)

    def flushed(self) -> None:
        """The client flushed (its cut is submitted): the source's later finals go
        without left context, unless `context_after_flush` keeps it."""
        if not self.config.context_after_flush:
            self._order.drop_left_context()

    def prompt_for_partial(self) -> str | None:
        """The prompt a partial of the utterance in progress decodes with
        (`FinalOrder.prompt_for_partial`)."""
        return self._order.prompt_for_partial()

    def speculative_utterance(self, event: UtteranceMayEnd, draft: str) -> Utterance | None:
        """What `submit` would send for the final of `event`'s utterance cut now (None
        while that is not known: its language is being detected, or its prompt or left
        context is an open final's)."""
        prompt = self.prompt_for_partial()
        if self.gate.language is None or prompt is None:
            return None
        utterance = self._utterance(event.audio, draft, prompt)
        return self._order.speculative(utterance, event.index, event.start, event.continues)

    def _utterance(self, audio: FloatArray, draft: str, prompt: str) -> Utterance:
        return Utterance(
            audio, self.gate.language, draft, prompt, word_timings=True, keyterms=self.keyterms
        )

    async def submit(self, event: UtteranceEnded, draft: str = "") -> PendingFinal:
        """Send the utterance `event` ended to the engine (or hold it for its language, or
        for its prompt: the final before it)."""
        utterance = self._utterance(event.audio, draft, "")  # the prompt: when admitted
        pending = PendingFinal(
            event.index, event.start, event.end, utterance, self.config.clock(), event.continues
        )
        if self._labeller is not None:
            pending.speakers = self._labeller.embed(event.audio)
        await self._order.cut(pending)
        return pending

    async def commit(self, pending: PendingFinal) -> Committed:
        """Await the final's result and log it; call in the order the finals were cut."""
        committed = await self._commit(pending)
        await self._order.committed(pending, committed.result, bool(committed.records))
        return committed

    async def _commit(self, pending: PendingFinal) -> Committed:
        result, lost = await self._result(pending)
        self.committed_index = pending.index  # its partials are stale from now on
        if pending.utterance.language is None and self.gate.detector is not None:
            await self._detected(result)
        if result is None:
            return Committed(None, [], lost)
        if not result.transcription.text.strip():
            self.empty += 1
            return Committed(result, [])
        transcription, prompt = result.transcription, pending.utterance.prompt
        records = []
        for part in await self._log.parts(
            pending,
            transcription,
            lambda audio: self._recognize_part(audio, transcription.language, prompt),
        ):
            # The text as the client asked for it, before anything keeps or sends it.
            text, words = self.text_filter.text(part.text), self.text_filter.words(part.words)
            part = replace(part, text=text, words=words)
            self._order.heard(part.text)
            records.append(
                await self._log.log(
                    pending, result, part, context=self._order.context, language=self.language
                )
            )
        await self._log.recluster()
        return Committed(result, records)

    async def finish(self) -> None:
        """No more finals: the speakers' best labelling, and a detection that never became
        sure pins the best it heard."""
        await self._log.recluster(final=True)
        pinned = self.gate.finish()
        if pinned is not None:
            self._pinned(pinned)

    async def close(self) -> None:
        """Stop what still runs for the source (speaker embeddings)."""
        if self._labeller is not None:
            await self._labeller.close()

    # ------------------------------------------------------------------ requests

    async def _submit(self, pending: PendingFinal) -> None:
        """Queue the final's request; an engine that stopped or died fails its future (the
        final is then lost in `commit`, which says why) instead of the caller."""
        try:
            request = self._request(pending.utterance, closed_at=pending.closed_at)
            pending.future = await self._recognition.submit(request)
        except SchedulerError as exc:
            failed: asyncio.Future[RecognitionResult] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            pending.future = failed

    def _request(self, utterance: Utterance, closed_at: float | None = None) -> RecognitionRequest:
        return RecognitionRequest(
            self.config.engine_key, self.config.priority, utterance, closed_at=closed_at
        )

    async def _recognize_part(
        self, audio: FloatArray, language: str, prompt: str
    ) -> Transcription | None:
        """Transcribe one speaker's part of an utterance on its own (with its prompt)."""
        utterance = Utterance(
            audio, language, prompt=prompt, word_timings=True, keyterms=self.keyterms
        )
        try:
            result = await (await self._recognition.submit(self._request(utterance)))
        except SchedulerError:
            logger.warning("a part of %s failed", self.config.session_id, exc_info=True)
            return None
        return result.transcription

    async def _result(
        self, pending: PendingFinal
    ) -> tuple[RecognitionResult | None, SchedulerError | None]:
        """The final's result; a failed batch is retried once before the final is lost."""
        if pending.future is None:
            raise RuntimeError(f"final {pending.index} reached the committer unsubmitted")
        try:
            return await self._order.meanwhile(pending.future), None
        except BatchFailed:
            logger.warning("final batch failed for %s; retrying", self.config.session_id)
        except (SchedulerStopped, EngineDead) as exc:  # nothing will run a retry
            logger.warning("final of %s lost: %s", self.config.session_id, exc)
            return None, exc
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not pending.future.cancelled() or (task is not None and task.cancelling()):
                raise  # this task is cancelled, not only the request
            logger.error("final of %s lost: its request was cancelled", self.config.session_id)
            return None, BatchFailed("the final's request was cancelled")
        try:
            return await (await self._recognition.submit(self._request(pending.utterance))), None
        except SchedulerError as exc:
            logger.exception("final of %s lost after retry", self.config.session_id)
            return None, exc

    # ------------------------------------------------------------------ language

    async def _detected(self, result: RecognitionResult | None) -> None:
        """A final sent without a language came back: let the gate judge it, then submit
        the finals it releases."""
        if result is not None:
            transcription = result.transcription
            pinned = self.gate.detected(
                transcription.language,
                transcription.language_probability,
                speech=bool(transcription.text.strip()),
            )
            if pinned is not None:
                self._pinned(pinned)
        for pending in self.gate.released():
            pending.utterance = dataclasses.replace(pending.utterance, language=self.language)
            await self._submit(pending)

    def _pinned(self, pinned: LanguagePinned) -> None:
        logger.info(
            "source %s: language %s (p=%.2f over %d utterances)",
            self.config.session_id,
            pinned.language,
            pinned.probability,
            pinned.utterances,
        )
        self._delivery.message(
            build.session_language(pinned.language, round(pinned.probability, 4), pinned.utterances)
        )
