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

Prompts (`CommitterConfig.prompts`): each final is decoded after the source's previous
finals' text (`Utterance.prompt`, the source's rolling `context`, which the store keeps
across a resume), as Whisper conditions on previous text. So a final is sent only once
the one before it is committed: one final of a source is with the engine at a time, and
the finals cut meanwhile wait in order (live, the previous final is almost always
committed by the time the next utterance ends; a file's utterances run one by one). A
final the hallucination guard emptied (no speech, a loop) clears the context: the next
final starts afresh rather than continue from what went wrong. A partial decodes with
its utterance's prompt (`prompt_for_partial`).

Left context (`CommitterConfig.left_context` seconds, 0: off): each final carries the
source's previous utterances' audio and final text (`session.said_before`), so the model
hears them ahead of the utterance. Like prompts, a final is then sent once the one before
it is committed; a final the guard emptied (or a lost one) leaves the next without.

How long a final waits for the one before it (`CommitterConfig.context_wait`): a file's
as long as it takes (its text matters, not when it comes), a live source's at most a
second. Past that it goes to the engine without its prompt or context, beside the one
still in flight, so a slow or stuck final never holds up the source's next ones by more
than that (finals of a source then share batches again, as with neither). The final
after it waits for it in turn and gets its context as usual.

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
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from engine.api import (
    SAMPLE_RATE,
    BatchFailed,
    EngineDead,
    LeftContext,
    Priority,
    Recognition,
    RecognitionRequest,
    RecognitionResult,
    SchedulerError,
    SchedulerStopped,
    SpeakerWindows,
    Transcription,
    Utterance,
)
from session.diarizer import Relabel
from session.language import LanguageGate, LanguagePinned
from session.pipeline import FloatArray, seconds
from session.said_before import SaidBefore
from session.segmenter import UtteranceEnded, UtteranceMayEnd
from session.speakers import LabelledPart, SpeakerLabeller, relabel
from session.telemetry import NullTelemetry, Telemetry
from store.api import Store
from store.records import FinalRecord, NewFinal, SourceState
from wire import build
from wire.messages import ServerMessage, Word

logger = logging.getLogger(__name__)

# Rolling text context kept per source: the prompt of its next final (the recognizer keeps
# its last `prompt_tokens` tokens; 128 tokens of English are ~600 characters).
CONTEXT_CHARS = 1000


class Delivery(Protocol):
    """Where a source's committed output goes besides the meeting's listeners."""

    def final(self, record: FinalRecord, payload: str) -> None:
        """A final was logged; `payload` is its encoded `transcript.final`."""

    def message(self, message: ServerMessage) -> None:
        """`session.language` once a detection pins, `transcript.speaker` on a relabel."""

    def relabelled(self, speakers: Mapping[str, str]) -> None:
        """Utterance id → speaker: labels a re-clustering changed."""


@dataclass(slots=True)
class PendingFinal:
    """A cut utterance on its way to the log."""

    index: int
    start: int  # samples on the source's timeline
    end: int
    utterance: Utterance
    closed_at: float  # when it was submitted (or cut, while held)
    # It goes on from the utterance before it, split by a client's cut in mid-speech: its
    # left context is `essential` (session/segmenter.py).
    continues: bool = False
    # None while held back until the source's language is known (language=auto only).
    future: asyncio.Future[RecognitionResult] | None = None
    # Its speaker embeddings, computed beside its recognition (diarized sources).
    speakers: asyncio.Task[SpeakerWindows | None] | None = None


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
    # Most seconds a final waits for the one before it (for its prompt or left context)
    # before it is sent without them; None: until that one is committed.
    context_wait: float | None = None
    # The languages whose finals carry left context; None: every language.
    context_languages: frozenset[str] | None = None
    clock: Callable[[], float] = time.monotonic
    telemetry: Telemetry = field(default_factory=NullTelemetry)
    # The engine's key for this connection's requests (None: the session_id).
    request_key: str | None = None

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
        self.source = source
        self._recognition = recognition
        self._store = store
        self._delivery = delivery
        self._labeller = labeller
        self.gate: LanguageGate[PendingFinal] = LanguageGate(
            config.requested_language,
            source.language if source is not None else None,
            config.model_languages,
        )
        self.committed_index = -1  # the last utterance whose final was handled
        # The source's recent final text: the next final's prompt (prompts on).
        self.context = source.context if source is not None else ""
        self._open = 0  # finals submitted (or waiting for their prompt), not yet committed
        self._waiting: deque[PendingFinal] = deque()  # cut, waiting for their prompt
        self._cut = asyncio.Event()  # a final started waiting
        self._said = SaidBefore()  # the next final's left context
        self.finals = 0
        self.empty = 0  # utterances the hallucination guard judged not to be speech
        self._unlogged = 0  # finals of a file that stands alone: their seq

    @property
    def language(self) -> str | None:
        return self.gate.language

    def _left_limit(self) -> float:
        """Most seconds of left context the source's next final carries: none with left
        context off or in a language it is not used for (a source whose language is
        still being detected may get it)."""
        languages, language = self.config.context_languages, self.gate.language
        if languages is not None and language is not None and language not in languages:
            return 0.0
        return self.config.left_context

    def _in_order(self) -> bool:
        """Whether a final waits for the one before it (its prompt or its context)."""
        return self.config.prompts or self._left_limit() > 0

    def prompt_for_partial(self) -> str | None:
        """The prompt a partial of the utterance in progress decodes with: its final's
        (the context once every earlier final is committed), "" with prompts off, None
        while an earlier final is still open (the partial would decode in another
        context than its final)."""
        if not self.config.prompts:
            return ""
        return None if self._open else self.context

    def speculative_utterance(self, event: UtteranceMayEnd, draft: str) -> Utterance | None:
        """What `submit` would send for the final of `event`'s utterance cut now (None
        while that is not known: its language is being detected, or its prompt or left
        context is an open final's)."""
        prompt = self.prompt_for_partial()
        if self.gate.language is None or prompt is None:
            return None
        utterance = self._utterance(event.audio, draft, prompt)
        limit = self._left_limit()
        if limit <= 0:
            return utterance
        if self._open:
            return None
        left = _essential(self._said.before(event.index, event.start, limit), event.continues)
        return dataclasses.replace(utterance, left=left)

    def _utterance(self, audio: FloatArray, draft: str, prompt: str) -> Utterance:
        return Utterance(audio, self.gate.language, draft, prompt, word_timings=True)

    async def submit(self, event: UtteranceEnded, draft: str = "") -> PendingFinal:
        """Send the utterance `event` ended to the engine (or hold it for its language, or
        for its prompt: the final before it)."""
        utterance = self._utterance(event.audio, draft, "")  # the prompt: when admitted
        pending = PendingFinal(
            event.index, event.start, event.end, utterance, self.config.clock(), event.continues
        )
        if self._labeller is not None:
            pending.speakers = self._labeller.embed(event.audio)
        self._open += 1
        if self._in_order() and self._open > 1:
            self._waiting.append(pending)
            self._cut.set()
        elif await self._admit(pending):
            pending.closed_at = self.config.clock()
        return pending

    async def _admit(self, pending: PendingFinal, *, alone: bool = False) -> bool:
        """Submit the final now, in the source's language and with its prompt and left
        context (none if `alone`: the final before it is still open), unless the language
        gate holds it (False)."""
        language = pending.utterance.language or self.gate.language
        pending.utterance = dataclasses.replace(pending.utterance, language=language)
        if self._in_order():
            limit = 0.0 if alone else self._left_limit()
            left = self._said.before(pending.index, pending.start, limit) if limit > 0 else None
            left = _essential(left, pending.continues)
            pending.utterance = dataclasses.replace(
                pending.utterance,
                prompt=self.context if self.config.prompts and not alone else "",
                left=left,
            )
        if not self.gate.admit(pending):
            return False
        await self._submit(pending)
        return True

    async def commit(self, pending: PendingFinal) -> Committed:
        """Await the final's result and log it; call in the order the finals were cut."""
        committed = await self._commit(pending)
        self._open -= 1
        if committed.result is not None and not committed.records:
            self.context = ""  # the guard emptied it: the next final starts afresh
        if committed.records and committed.result is not None and self._left_limit() > 0:
            transcription = committed.result.transcription
            self._said.add(
                pending.index,
                pending.start,
                pending.end,
                pending.utterance.audio,
                transcription.text.strip(),
                transcription.words,
            )
        else:
            self._said.clear()
        if not self._in_order():  # the language pinned is one without left context
            while self._waiting:
                await self._admit(self._waiting.popleft())
        elif self._waiting and self._open == len(self._waiting):  # none in flight before it
            await self._admit(self._waiting.popleft())
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
        records = [
            await self._log(pending, result, part)
            for part in await self._parts(pending, result.transcription)
        ]
        if self._labeller is not None:
            await self._relabel(await self._labeller.recluster())
        return Committed(result, records)

    async def finish(self) -> None:
        """No more finals: the speakers' best labelling, and a detection that never became
        sure pins the best it heard."""
        if self._labeller is not None:
            await self._relabel(await self._labeller.recluster(final=True))
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

    async def _meanwhile(self, future: asyncio.Future[RecognitionResult]) -> RecognitionResult:
        """Await an open final's result; meanwhile send each final that has waited
        `context_wait` for the one before it, without its prompt and context."""
        wait = self.config.context_wait
        while wait is not None and self._in_order() and not future.done():
            if not self._waiting:  # until one is cut, or the result comes
                self._cut.clear()
                cut = asyncio.ensure_future(self._cut.wait())
                either: set[asyncio.Future[object]] = {future, cut}  # type: ignore[arg-type]
                try:
                    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    cut.cancel()
                continue
            delay = self._waiting[0].closed_at + wait - self.config.clock()
            if delay > 0:
                await asyncio.wait({future}, timeout=delay)
            else:
                await self._admit(self._waiting.popleft(), alone=True)
        return await future

    def _request(self, utterance: Utterance, closed_at: float | None = None) -> RecognitionRequest:
        return RecognitionRequest(
            self.config.engine_key, self.config.priority, utterance, closed_at=closed_at
        )

    async def _result(
        self, pending: PendingFinal
    ) -> tuple[RecognitionResult | None, SchedulerError | None]:
        """The final's result; a failed batch is retried once before the final is lost."""
        if pending.future is None:
            raise RuntimeError(f"final {pending.index} reached the committer unsubmitted")
        try:
            return await self._meanwhile(pending.future), None
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

    # ------------------------------------------------------------------ speakers

    async def _parts(
        self, pending: PendingFinal, transcription: Transcription
    ) -> list[LabelledPart]:
        """The finals one recognized utterance makes: itself, or (diarized) one per
        speaker in it, each labelled."""
        utterance_id = f"{self.config.session_id}-{pending.index}"
        if self._labeller is None or pending.speakers is None:
            text, words = transcription.text.strip(), transcription.words
            span = pending.end - pending.start
            return [LabelledPart(utterance_id, 0, span, text, words, "", transcription.language)]
        prompt = pending.utterance.prompt
        return await self._labeller.label(
            utterance_id,
            pending.start / SAMPLE_RATE,
            pending.utterance.audio,
            await pending.speakers,
            transcription,
            lambda audio: self._recognize_part(audio, transcription.language, prompt),
        )

    async def _recognize_part(
        self, audio: FloatArray, language: str, prompt: str
    ) -> Transcription | None:
        """Transcribe one speaker's part of an utterance on its own (with its prompt)."""
        utterance = Utterance(audio, language, prompt=prompt, word_timings=True)
        try:
            result = await (await self._recognition.submit(self._request(utterance)))
        except SchedulerError:
            logger.warning("a part of %s failed", self.config.session_id, exc_info=True)
            return None
        return result.transcription

    async def _relabel(self, relabels: list[Relabel]) -> None:
        """Announce the speakers a re-clustering changed: to the caller, the meeting's log
        and its listeners."""
        if not relabels:
            return
        self._delivery.relabelled({r.key: r.label for r in relabels})
        if self.source is None:
            return
        meeting_id = self.source.meeting_id
        for message in await relabel(self._store, meeting_id, relabels):
            self._delivery.message(message)
            await self._store.publish(meeting_id, build.encode(message).encode())

    # ------------------------------------------------------------------ the log

    async def _log(
        self, pending: PendingFinal, result: RecognitionResult, part: LabelledPart
    ) -> FinalRecord:
        """Log one final (or number it, for a file that stands alone), hand it to the
        caller, then to the meeting's listeners."""
        start = pending.start + part.start
        end = max(start, min(pending.start + part.end, pending.end))
        offset = pending.start / SAMPLE_RATE
        first, last = seconds(start), seconds(end)

        def inside(time: float) -> float:  # a file's last utterance may run past its end
            return min(max(round(offset + time, 3), first), last)

        words: list[Word] = [
            {
                "word": w.word,
                "start": inside(w.start),
                "end": inside(w.end),
                "probability": w.probability,
            }
            for w in part.words
        ]
        final = NewFinal(
            utterance_id=part.utterance_id,
            session_id=self.config.session_id,
            participant=self.config.participant,
            text=part.text,
            start=first,
            end=last,
            language=part.language,
            words=words,
            speaker=part.speaker or None,
            origin=self.source.origin if self.source is not None else None,
        )
        record = await self._append(final, end, pending.index)
        self.finals += 1
        total = self.config.clock() - pending.closed_at
        timing = None
        if self.config.timing:
            timing = build.timing(queue=result.queue_wait, inference=result.inference, total=total)
        self.config.telemetry.final_sent(total)
        payload = build.encode(build.transcript_final(record, timing))
        self._delivery.final(record, payload)
        if self.source is not None:
            await self._store.publish(self.source.meeting_id, payload.encode())
        return record

    async def _append(self, final: NewFinal, end: int, index: int) -> FinalRecord:
        """Append to the meeting's log with the source's next state, in one store step."""
        self.context = (self.context + " " + final.text)[-CONTEXT_CHARS:].strip()
        if self.source is None:
            self._unlogged += 1
            return FinalRecord.from_new(self._unlogged, final)
        acked = dataclasses.replace(
            self.source,
            acked_until=end / SAMPLE_RATE,  # exact: resume re-sends from here
            next_utterance=index + 1,
            context=self.context,
            language=self.language,
        )
        record = await self._store.append_final(self.source.meeting_id, final, acked)
        self.source = acked
        return record


def _essential(left: LeftContext | None, continues: bool) -> LeftContext | None:
    """The left context of an utterance that goes on from it without a pause (a client's
    cut in mid-speech): essential (alone, its first word would be cut), and its text
    without its last word, the one the cut fell in: the model hears that word whole
    across the cut and writes it again as the utterance's first."""
    if left is None or not continues:
        return left
    shorter = _essential(left.shorter, continues)
    text, _, _ = left.text.rstrip().rpartition(" ")
    return dataclasses.replace(
        left, text=text, words=left.words[:-1], shorter=shorter, essential=True
    )
