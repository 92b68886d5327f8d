"""One source's audio in, segment events out: decode → VAD → segmenter.

The live actor feeds it binary frames as they arrive; the file transcriber feeds it the
decoded file in slices. Both then hand what it returns to the same steps: every
`UtteranceEnded` becomes a final request through the source's `Committer`; a live
source also turns `PartialDue` into partial requests and `SpeechStarted`/`SpeechStopped`
into `vad.*` messages. Times are samples on the source's own timeline, which starts at
`start_sample` (non-zero for a resumed stream).

A resumed stream goes on from the VAD state stored with its last final (`vad_start`), so
its VAD hears what the unbroken stream's heard; `vad_state_at(index)` gives the state to
store with each final. It may also take a `lead`: audio the client re-sends from before
`start_sample` (from `session.started`'s `send_from`) for the left context of its next
final. The lead is kept (`lead_audio`), never scored or segmented: it was transcribed.

With a turn model (`turns`), each `TurnCheck` the segmenter makes is answered in place: the
pipeline awaits the model (on its own thread, batched across streams: session/turn.py) and
gives the answer to the segmenter before the next window; what that decides (an
utterance's end) follows in the events. Without one, a check is answered None (the
segmenter's silence rule). With `turn_words` (the live actor's: its speculative final's
text), the words so far are asked at the same time: a turn that stops on "the" or "we
should" waits, whatever the model says (session/turn_words.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import numpy as np
import numpy.typing as npt

from engine.api import SAMPLE_RATE
from session.audio import FrameDecoder
from session.segmenter import Segmenter, SegmenterConfig, SegmentEvent, TurnCheck, UtteranceEnded
from session.telemetry import NullTelemetry, Telemetry
from session.turn import TurnScorer
from session.vad import WINDOW, VadScorer, VadState, VadStream

FloatArray = npt.NDArray[np.float32]
# Whether a turn's words so far stop where a sentence cannot end (session/turn_words.py);
# False when they are not known in time.
TurnWords = Callable[[TurnCheck], Awaitable[bool]]

ENDED_KEPT = 16  # utterances whose end's VAD state waits to be taken
SLICE_SAMPLES = 16 * WINDOW  # VAD windows scored between two yields (a few ms)


def seconds(sample: int) -> float:
    """A sample of the source's timeline in seconds, as messages carry it (to the ms)."""
    return round(sample / SAMPLE_RATE, 3)


class AudioPipeline:
    def __init__(
        self,
        decoder: FrameDecoder,
        vad: VadScorer,
        segmenter: SegmenterConfig,
        *,
        start_sample: int = 0,
        first_index: int = 0,
        telemetry: Telemetry | None = None,
        vad_start: VadState | None = None,
        turns: TurnScorer | None = None,
        turn_events: bool = False,
        turn_words: TurnWords | None = None,
    ) -> None:
        self._decoder = decoder
        self._vad = VadStream(vad, vad_start)
        self._segmenter = Segmenter(
            segmenter, start_sample=start_sample, first_index=first_index, turn_events=turn_events
        )
        self._telemetry = telemetry or NullTelemetry()
        self._turns = turns
        self._turn_words = turn_words
        self._start_sample = start_sample
        self._ended_states: dict[int, str | None] = {}  # utterance index → VAD state at its end
        self._lead: list[FloatArray] = []
        self._lead_left = 0  # lead samples still to come
        self.samples = 0  # samples taken in (after decoding; the lead not counted)

    def expect_lead(self, samples: int) -> None:
        """The next `samples` samples come from before `start_sample`: keep them aside."""
        if self.samples or self._lead or self._lead_left:
            raise RuntimeError("a lead comes first, and once")
        self._lead_left = samples

    @property
    def lead_complete(self) -> bool:
        """Whether a lead was expected and has come whole."""
        return bool(self._lead) and not self._lead_left

    def take_lead(self) -> FloatArray:
        """The lead as it came (the samples just before `start_sample`), handed over: the
        pipeline keeps none of it (it is not the pipeline's to hear)."""
        lead = np.concatenate(self._lead) if self._lead else np.zeros(0, np.float32)
        self._lead = []
        return lead

    def vad_state_at(self, index: int) -> str | None:
        """The packed VAD state at the end of utterance `index` (None if unknown); once."""
        return self._ended_states.pop(index, None)

    @property
    def position(self) -> int:
        """The sample the segmenter has reached."""
        return self._segmenter.position

    async def decode(self, frame: bytes) -> list[SegmentEvent]:
        """One binary frame of the source's encoding and rate."""
        samples = self._decoder.decode(frame)
        if self._lead_left:
            lead = samples[: self._lead_left]
            self._lead.append(lead)
            self._lead_left -= len(lead)
            samples = samples[len(lead) :]
        return await self.push(samples)

    async def push(self, samples: FloatArray) -> list[SegmentEvent]:
        """Samples at the model's rate: score every whole VAD window, segment them.

        A large frame (a client may send up to 1 MiB: 1,024 windows, ~0.2 s of VAD) is
        scored in slices of SLICE_SAMPLES with a yield between them, so other streams are
        served meanwhile, as a file is."""
        self.samples += len(samples)
        events: list[SegmentEvent] = []
        for offset in range(0, len(samples), SLICE_SAMPLES):
            if offset:
                await asyncio.sleep(0)  # let other streams run between slices
            started = time.perf_counter()
            waited = 0.0  # on the turn model
            scored = await self._vad.process(samples[offset : offset + SLICE_SAMPLES])
            for window, probability in scored:
                for event in self._segmenter.push(window, probability):
                    if isinstance(event, TurnCheck):
                        asked = time.perf_counter()
                        events.extend(self._noted(await self._decide(event)))
                        waited += time.perf_counter() - asked
                    else:
                        events.extend(self._noted([event]))
            self._telemetry.vad_processed(time.perf_counter() - started - waited, len(scored))
        return events

    async def _decide(self, check: TurnCheck) -> list[SegmentEvent]:
        """The turn model's answer to `check` and, with `turn_words`, whether the words so
        far are unfinished (asked together), given to the segmenter: what it decides."""
        if self._turns is None:
            return self._segmenter.decide(check.index, None)
        if self._turn_words is None:
            probability = await self._turns.probability(check.audio)
            return self._segmenter.decide(check.index, probability)
        probability, unfinished = await asyncio.gather(
            self._turns.probability(check.audio), self._turn_words(check)
        )
        return self._segmenter.decide(check.index, probability, unfinished=unfinished)

    def cut(self) -> list[SegmentEvent]:
        """End the utterance in progress now (`finalize`: in mid-speech, the speech goes on
        as the next utterance, `Segmenter.finalize`)."""
        return self._noted(self._segmenter.finalize())

    def flush(self) -> list[SegmentEvent]:
        """The audio is over: end the utterance in progress."""
        return self._noted(self._segmenter.flush())

    def _noted(self, events: list[SegmentEvent]) -> list[SegmentEvent]:
        """Note the VAD state at the end of each utterance that ended (while it is kept)."""
        for event in events:
            if isinstance(event, UtteranceEnded):
                at = event.end - self._start_sample
                self._ended_states[event.index] = self._vad.state_at(at)
                while len(self._ended_states) > ENDED_KEPT:  # a caller that takes none
                    del self._ended_states[next(iter(self._ended_states))]
        return events

    async def end(self) -> list[SegmentEvent]:
        """The audio is over: what the resampler still holds, then the utterance in progress."""
        return [*await self.push(self._decoder.flush()), *self.flush()]
