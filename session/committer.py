"""The committer: one source's finals, from the cut utterance to the meeting log.

The live actor and the file transcriber both hand every utterance the segmenter ends to
`Committer.submit`, and later `commit` them in the order they were cut:

- `submit` sends the final's request to the engine in the source's language. A source
  whose language is to be detected goes through its `LanguageGate`: one final detects
  at a time and the finals cut meanwhile are held, then sent in the language it pinned.
- `commit` awaits the result (a failed batch is retried once; when the retry fails too,
  the final is lost and `Committed.lost` says why), feeds a detection to the gate, skips
  what the hallucination guard emptied, and appends the final to the meeting log with the
  source's next state (audio acknowledged, next utterance, rolling context, language) in
  one store step; the store gives it its `seq`. Its message goes to the caller
  (`deliver`: the live client's outbox, a file's progress), then to the meeting's
  listeners. A file that stands alone (no meeting source) numbers its finals itself.

A final's request is keyed by the source's `session_id`: `Recognition.cancel(session_id)`
drops whatever the source still has queued.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.api import (
    SAMPLE_RATE,
    BatchFailed,
    Priority,
    Recognition,
    RecognitionRequest,
    RecognitionResult,
    SchedulerError,
    Utterance,
)
from session.language import LanguageGate, LanguagePinned
from session.pipeline import seconds
from session.protocol import Word, encode
from session.segmenter import UtteranceEnded
from session.store import FinalRecord, NewFinal, SourceState, Store
from session.telemetry import NullTelemetry, Telemetry

logger = logging.getLogger(__name__)

CONTEXT_CHARS = 400  # rolling text context kept per source


@dataclass(slots=True)
class PendingFinal:
    """A cut utterance on its way to the log."""

    index: int
    start: int  # samples on the source's timeline
    end: int
    utterance: Utterance
    closed_at: float  # when it was submitted (or cut, while held)
    # None while held back until the source's language is known (language=auto only).
    future: asyncio.Future[RecognitionResult] | None = None


@dataclass(frozen=True, slots=True)
class Committed:
    """What became of one final."""

    result: RecognitionResult | None  # None: lost
    record: FinalRecord | None  # None: lost, or the guard judged it not speech
    lost: SchedulerError | None = None  # why the final was lost (its retry failed too)


@dataclass(frozen=True, slots=True)
class CommitterConfig:
    """Who the finals are from and how they travel."""

    session_id: str  # the engine's request key; prefix of every utterance id
    participant: str
    priority: Priority  # FINAL for a live source, FILE for an upload
    timing: bool  # put the server's timings in each final's message (live)
    requested_language: str | None  # None: detect (language=auto)
    model_languages: frozenset[str]
    clock: Callable[[], float] = time.monotonic
    telemetry: Telemetry = field(default_factory=NullTelemetry)


class Committer:
    def __init__(
        self,
        config: CommitterConfig,
        recognition: Recognition,
        store: Store,
        source: SourceState | None,
        *,
        deliver: Callable[[FinalRecord, str], None],
        on_pinned: Callable[[LanguagePinned], None] = lambda pinned: None,
    ) -> None:
        """`source`: the meeting source the finals are logged as (None: a file that
        stands alone). `deliver(record, payload)` takes each final before it is
        published; `on_pinned` hears when a detected language is pinned."""
        if source is not None and source.session_id != config.session_id:
            raise ValueError("a committer logs as its source: session ids must agree")
        self.config = config
        self.source = source
        self._recognition = recognition
        self._store = store
        self._deliver = deliver
        self._on_pinned = on_pinned
        self.gate: LanguageGate[PendingFinal] = LanguageGate(
            config.requested_language,
            source.language if source is not None else None,
            config.model_languages,
        )
        self.committed_index = -1  # the last utterance whose final was handled
        self.finals = 0
        self.empty = 0  # utterances the hallucination guard judged not to be speech
        self._unlogged = 0  # finals of a file that stands alone: their seq

    @property
    def language(self) -> str | None:
        return self.gate.language

    async def submit(self, event: UtteranceEnded, draft: str = "") -> PendingFinal:
        """Send the utterance `event` ended to the engine (or hold it for its language)."""
        pending = PendingFinal(
            event.index,
            event.start,
            event.end,
            Utterance(event.audio, self.gate.language, draft),
            self.config.clock(),
        )
        if self.gate.admit(pending):
            await self._submit(pending)
            pending.closed_at = self.config.clock()
        return pending

    async def commit(self, pending: PendingFinal) -> Committed:
        """Await the final's result and log it; call in the order the finals were cut."""
        result, lost = await self._result(pending)
        self.committed_index = pending.index  # its partials are stale from now on
        if pending.utterance.language is None and self.gate.detector is not None:
            await self._detected(result)
        if result is None:
            return Committed(None, None, lost)
        text = result.transcription.text.strip()
        if not text:
            self.empty += 1
            return Committed(result, None)
        record = await self._log(pending, result, text)
        self.finals += 1
        total = self.config.clock() - pending.closed_at
        message = record.message()
        if self.config.timing:
            message["timing"] = {
                "queue": round(result.queue_wait, 4),
                "inference": round(result.inference, 4),
                "total": round(total, 4),
            }
        self.config.telemetry.final_sent(total)
        payload = encode(message)
        self._deliver(record, payload)
        if self.source is not None:
            await self._store.publish(self.source.meeting_id, payload.encode())
        return Committed(result, record)

    def finish(self) -> None:
        """No more finals: a detection that never became sure pins the best it heard."""
        pinned = self.gate.finish()
        if pinned is not None:
            self._pinned(pinned)

    # ------------------------------------------------------------------ steps

    async def _submit(self, pending: PendingFinal) -> None:
        pending.future = await self._recognition.submit(self._request(pending))

    def _request(self, pending: PendingFinal) -> RecognitionRequest:
        return RecognitionRequest(self.config.session_id, self.config.priority, pending.utterance)

    async def _result(
        self, pending: PendingFinal
    ) -> tuple[RecognitionResult | None, SchedulerError | None]:
        """The final's result; a failed batch is retried once before the final is lost."""
        if pending.future is None:
            raise RuntimeError(f"final {pending.index} reached the committer unsubmitted")
        try:
            return await pending.future, None
        except BatchFailed:
            logger.warning("final batch failed for %s; retrying", self.config.session_id)
        try:
            return await (await self._recognition.submit(self._request(pending))), None
        except SchedulerError as exc:
            logger.exception("final of %s lost after retry", self.config.session_id)
            return None, exc

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
        self._on_pinned(pinned)

    async def _log(
        self, pending: PendingFinal, result: RecognitionResult, text: str
    ) -> FinalRecord:
        """Append the final to the meeting log with the source's next state (or number it,
        for a file that stands alone)."""
        start = seconds(pending.start)
        words: list[Word] = [
            {"word": w.word, "start": round(start + w.start, 3), "end": round(start + w.end, 3)}
            for w in result.transcription.words
        ]
        final = NewFinal(
            utterance_id=f"{self.config.session_id}-{pending.index}",
            session_id=self.config.session_id,
            participant=self.config.participant,
            text=text,
            start=start,
            end=seconds(pending.end),
            language=result.transcription.language,
            words=words,
        )
        if self.source is None:
            self._unlogged += 1
            return FinalRecord.from_new(self._unlogged, final)
        acked = dataclasses.replace(
            self.source,
            acked_until=pending.end / SAMPLE_RATE,  # exact: resume re-sends from here
            next_utterance=pending.index + 1,
            context=(self.source.context + " " + text)[-CONTEXT_CHARS:].strip(),
            language=self.language,
        )
        record = await self._store.append_final(self.source.meeting_id, final, acked)
        self.source = acked
        return record
