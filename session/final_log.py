"""The log end of a source's finals: one recognized utterance becomes its finals in the
meeting's log, cut at its speakers and relabelled as they are re-clustered.

- `parts`: the finals one recognized utterance makes: itself, or (a diarized source) one
  per speaker in it, each labelled (`SpeakerLabeller.label`; a part the word timings
  cannot split is transcribed on its own through `recognize`).
- `log` appends one final to the meeting's log with the source's next state (audio
  acknowledged, next utterance, rolling context, language) in one store step; the store
  gives it its `seq`. Its message goes to the caller's `Delivery` (the live client, a
  file's result), then to the meeting's listeners. A file that stands alone (no meeting
  source) numbers its finals itself.
- `recluster` re-clusters a diarized source's speakers every so often (and at its end)
  and announces the labels that changed: to the caller, the meeting's log and its
  listeners.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Protocol

from engine.api import SAMPLE_RATE, RecognitionResult, Transcription
from session.final_order import PendingFinal
from session.pipeline import seconds
from session.speakers import LabelledPart, Recognize, SpeakerLabeller, relabel
from session.telemetry import Telemetry
from store.api import Store
from store.records import FinalRecord, NewFinal, SourceState
from wire import build
from wire.messages import ServerMessage, Word


class Delivery(Protocol):
    """Where a source's committed output goes besides the meeting's listeners."""

    def final(self, record: FinalRecord, payload: str) -> None:
        """A final was logged; `payload` is its encoded `transcript.final`."""

    def message(self, message: ServerMessage) -> None:
        """`session.language` once a detection pins, `transcript.speaker` on a relabel."""

    def relabelled(self, speakers: Mapping[str, str]) -> None:
        """Utterance id → speaker: labels a re-clustering changed."""


class FinalLog:
    def __init__(
        self,
        store: Store,
        source: SourceState | None,
        delivery: Delivery,
        labeller: SpeakerLabeller | None,
        *,
        session_id: str,
        participant: str,
        timing: bool,
        clock: Callable[[], float],
        telemetry: Telemetry,
    ) -> None:
        """`source`: the meeting source the finals are logged as (None: a file that
        stands alone); the rest is `CommitterConfig`'s."""
        self.source = source
        self._store = store
        self._delivery = delivery
        self._labeller = labeller
        self._session_id = session_id
        self._participant = participant
        self._timing = timing
        self._clock = clock
        self._telemetry = telemetry
        self.finals = 0
        self._unlogged = 0  # finals of a file that stands alone: their seq

    async def parts(
        self, pending: PendingFinal, transcription: Transcription, recognize: Recognize
    ) -> list[LabelledPart]:
        """The finals one recognized utterance makes: itself, or (diarized) one per
        speaker in it, each labelled."""
        utterance_id = f"{self._session_id}-{pending.index}"
        if self._labeller is None or pending.speakers is None:
            text, words = transcription.text.strip(), transcription.words
            span = pending.end - pending.start
            return [LabelledPart(utterance_id, 0, span, text, words, "", transcription.language)]
        return await self._labeller.label(
            utterance_id,
            pending.start / SAMPLE_RATE,
            pending.utterance.audio,
            await pending.speakers,
            transcription,
            recognize,
        )

    async def recluster(self, *, final: bool = False) -> None:
        """Re-cluster a diarized source's speakers when due (`final`: at its end) and
        announce the labels that changed: to the caller, the meeting's log and its
        listeners."""
        if self._labeller is None:
            return
        relabels = await self._labeller.recluster(final=final)
        if not relabels:
            return
        self._delivery.relabelled({r.key: r.label for r in relabels})
        if self.source is None:
            return
        meeting_id = self.source.meeting_id
        for message in await relabel(self._store, meeting_id, relabels):
            self._delivery.message(message)
            await self._store.publish(meeting_id, build.encode(message).encode())

    async def log(
        self,
        pending: PendingFinal,
        result: RecognitionResult,
        part: LabelledPart,
        *,
        context: str,
        language: str | None,
    ) -> FinalRecord:
        """Log one final (or number it, for a file that stands alone) with the source's
        rolling `context` and `language` after it, hand it to the caller, then to the
        meeting's listeners."""
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
            session_id=self._session_id,
            participant=self._participant,
            text=part.text,
            start=first,
            end=last,
            language=part.language,
            words=words,
            speaker=part.speaker or None,
            origin=self.source.origin if self.source is not None else None,
        )
        vad_state = pending.vad_state if end == pending.end else None  # not a part's end
        record = await self._append(final, end, pending.index, context, language, vad_state)
        self.finals += 1
        total = self._clock() - pending.closed_at
        timing = None
        if self._timing:
            timing = build.timing(queue=result.queue_wait, inference=result.inference, total=total)
        self._telemetry.final_sent(total)
        payload = build.encode(build.transcript_final(record, timing))
        self._delivery.final(record, payload)
        if self.source is not None:
            await self._store.publish(self.source.meeting_id, payload.encode())
        return record

    async def _append(
        self,
        final: NewFinal,
        end: int,
        index: int,
        context: str,
        language: str | None,
        vad_state: str | None,
    ) -> FinalRecord:
        """Append to the meeting's log with the source's next state, in one store step."""
        if self.source is None:
            self._unlogged += 1
            return FinalRecord.from_new(self._unlogged, final)
        acked = dataclasses.replace(
            self.source,
            acked_until=end / SAMPLE_RATE,  # exact: resume re-sends from here
            next_utterance=index + 1,
            context=context,
            language=language,
            vad_state=vad_state,
        )
        record = await self._store.append_final(self.source.meeting_id, final, acked)
        self.source = acked
        return record
