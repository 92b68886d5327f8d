"""One source's audio in, segment events out: decode → VAD → segmenter.

The live actor feeds it binary frames as they arrive; the file transcriber feeds it the
decoded file in slices. Both then hand what it returns to the same steps: every
`UtteranceEnded` becomes a final request through the source's `Committer`; a live
source also turns `PartialDue` into partial requests and `SpeechStarted`/`SpeechStopped`
into `vad.*` messages. Times are samples on the source's own timeline, which starts at
`start_sample` (non-zero for a resumed stream).
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import numpy.typing as npt

from engine.api import SAMPLE_RATE
from session.audio import FrameDecoder
from session.segmenter import Segmenter, SegmenterConfig, SegmentEvent
from session.telemetry import NullTelemetry, Telemetry
from session.vad import WINDOW, VadScorer, VadStream

FloatArray = npt.NDArray[np.float32]

SLICE_SAMPLES = 16 * WINDOW  # VAD windows scored between two yields (~3 ms on this box)


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
    ) -> None:
        self._decoder = decoder
        self._vad = VadStream(vad)
        self._segmenter = Segmenter(segmenter, start_sample=start_sample, first_index=first_index)
        self._telemetry = telemetry or NullTelemetry()
        self.samples = 0  # samples taken in (after decoding)

    @property
    def position(self) -> int:
        """The sample the segmenter has reached."""
        return self._segmenter.position

    async def decode(self, frame: bytes) -> list[SegmentEvent]:
        """One binary frame of the source's encoding and rate."""
        return await self.push(self._decoder.decode(frame))

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
            scored = await self._vad.process(samples[offset : offset + SLICE_SAMPLES])
            for window, probability in scored:
                events.extend(self._segmenter.push(window, probability))
            self._telemetry.vad_processed(time.perf_counter() - started, len(scored))
        return events

    def cut(self) -> list[SegmentEvent]:
        """End the utterance in progress now (`finalize`: in mid-speech, the speech goes on
        as the next utterance, `Segmenter.finalize`)."""
        return self._segmenter.finalize()

    def flush(self) -> list[SegmentEvent]:
        """The audio is over: end the utterance in progress."""
        return self._segmenter.flush()

    async def end(self) -> list[SegmentEvent]:
        """The audio is over: what the resampler still holds, then the utterance in progress."""
        return [*await self.push(self._decoder.flush()), *self.flush()]
