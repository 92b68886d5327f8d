"""Batched VAD: the same decisions as one stream at a time, with streams joining and leaving."""

from __future__ import annotations

import asyncio

import numpy as np
import numpy.typing as npt

from session.segmenter import Segmenter, SegmenterConfig, UtteranceEnded
from session.vad import DirectScorer, SileroVad, VadBatcher, VadScorer, VadState, VadStream
from tests.corpus import clip

FRAME = 320  # 20 ms frames, as a browser sends them


async def run_stream(
    scorer: VadScorer, audio: npt.NDArray[np.float32], delay_frames: int = 0
) -> tuple[list[float], list[tuple[int, int]]]:
    """Feed a stream frame by frame (yielding between frames like a socket reader)."""
    for _ in range(delay_frames):
        await asyncio.sleep(0)
    stream = VadStream(scorer)
    segmenter = Segmenter(SegmenterConfig())
    probabilities: list[float] = []
    utterances: list[tuple[int, int]] = []
    for i in range(0, len(audio), FRAME):
        for window, p in await stream.process(audio[i : i + FRAME]):
            probabilities.append(p)
            for event in segmenter.push(window, p):
                if isinstance(event, UtteranceEnded):
                    utterances.append((event.start, event.end))
        await asyncio.sleep(0)
    utterances += [(e.start, e.end) for e in segmenter.flush() if isinstance(e, UtteranceEnded)]
    return probabilities, utterances


async def test_batched_vad_matches_the_per_stream_path() -> None:
    """Five streams through one batcher — joining late, one leaving early — score like the
    per-stream path and cut the same utterances, in far fewer model calls."""
    model = SileroVad()
    clips = ["en_jfk", "en_ls_2412-153948-0000", "en_mfa_uhum", "en_timit_LDC93S1", "en_jfk"]
    audios = [clip(c).samples() for c in clips]
    audios[4] = audios[4][: len(audios[4]) // 3]  # leaves mid-stream
    delays = [0, 7, 30, 55, 3]  # joins after that many loop turns
    reference = [await run_stream(DirectScorer(model), a) for a in audios]
    batcher = VadBatcher(model, max_delay=0.002)
    batched = await asyncio.gather(
        *(run_stream(batcher, a, d) for a, d in zip(audios, delays, strict=True))
    )
    for (want_p, want_u), (got_p, got_u) in zip(reference, batched, strict=True):
        assert len(got_p) == len(want_p)
        np.testing.assert_allclose(got_p, want_p, atol=1e-4)
        assert got_u == want_u
    assert batcher.windows == sum(len(p) for p, _ in reference)
    assert batcher.calls < batcher.windows / 2, (batcher.calls, batcher.windows)


async def test_cancelled_request_does_not_disturb_the_others() -> None:
    """A stream cancelled while waiting for its tick is skipped; the others get results."""
    model = SileroVad()
    batcher = VadBatcher(model, max_delay=0.05)
    audio = clip("en_jfk").samples()[:4096].reshape(8, 512)
    doomed = asyncio.create_task(batcher.score(VadState(), audio))
    kept = asyncio.create_task(batcher.score(VadState(), audio))
    await asyncio.sleep(0)
    doomed.cancel()
    result = await kept
    assert result.shape == (8,) and doomed.cancelled()
    direct = await DirectScorer(model).score(VadState(), audio)
    np.testing.assert_allclose(result, direct, atol=1e-4)
