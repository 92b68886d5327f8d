"""Batched VAD: the same decisions as one stream at a time, with streams joining and leaving."""

from __future__ import annotations

import asyncio

import numpy as np
import numpy.typing as npt

from session.segmenter import Segmenter, SegmenterConfig, UtteranceEnded
from session.vad import DirectScorer, SileroVad, VadBatcher, VadScorer, VadState, VadStream
from tests.support.corpus import clip

FRAME = 320  # 20 ms frames, as a browser sends them


class Recorder:
    """One stream: its VAD, its segmenter, and what they produced."""

    def __init__(self, scorer: VadScorer, audio: npt.NDArray[np.float32], join: int) -> None:
        self.stream = VadStream(scorer)
        self.segmenter = Segmenter(SegmenterConfig())
        self.frames = [audio[i : i + FRAME] for i in range(0, len(audio), FRAME)]
        self.join = join  # the frame tick at which this stream connects
        self.probabilities: list[float] = []
        self.utterances: list[tuple[int, int]] = []

    async def feed(self, tick: int) -> None:
        index = tick - self.join
        if not 0 <= index < len(self.frames):
            return
        for window, p in await self.stream.process(self.frames[index]):
            self.probabilities.append(p)
            for event in self.segmenter.push(window, p):
                if isinstance(event, UtteranceEnded):
                    self.utterances.append((event.start, event.end))
        if index == len(self.frames) - 1:
            flushed = self.segmenter.flush()
            self.utterances += [(e.start, e.end) for e in flushed if isinstance(e, UtteranceEnded)]

    @property
    def ticks(self) -> int:
        return self.join + len(self.frames)


async def run_together(recorders: list[Recorder]) -> None:
    """Every stream's frame of one tick arrives in the same loop turn, as from one poll."""
    for tick in range(max(r.ticks for r in recorders)):
        await asyncio.gather(*(r.feed(tick) for r in recorders))


async def test_batched_vad_matches_the_per_stream_path() -> None:
    """Five streams through one batcher — joining late, one leaving early — score like the
    per-stream path and cut the same utterances, in far fewer model calls."""
    model = SileroVad()
    clips = ["en_jfk", "en_ls_2412-153948-0000", "en_mfa_uhum", "en_timit_LDC93S1", "en_jfk"]
    audios = [clip(c).samples() for c in clips]
    audios[4] = audios[4][: len(audios[4]) // 3]  # leaves mid-stream
    joins = [0, 7, 30, 55, 3]  # connects at that frame tick
    reference = [Recorder(DirectScorer(model), a, 0) for a in audios]
    for recorder in reference:
        await run_together([recorder])
    batcher = VadBatcher(model)
    batched = [Recorder(batcher, a, j) for a, j in zip(audios, joins, strict=True)]
    await run_together(batched)
    for want, got in zip(reference, batched, strict=True):
        assert len(got.probabilities) == len(want.probabilities)
        np.testing.assert_allclose(got.probabilities, want.probabilities, atol=1e-4)
        assert got.utterances == want.utterances
    assert batcher.windows == sum(len(r.probabilities) for r in reference)
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


async def staggered(recorders: list[Recorder]) -> None:
    """Real-time streams that arrive apart: at every frame tick, each stream's frame comes
    in a loop turn of its own (stream i after i turns), as from polls a few ms apart. The
    order is set by loop turns, not by the wall clock, so a loaded machine cannot reorder it."""

    async def later(recorder: Recorder, tick: int, turns: int) -> None:
        for _ in range(turns):
            await asyncio.sleep(0)
        await recorder.feed(tick)

    for tick in range(max(r.ticks for r in recorders)):
        await asyncio.gather(*(later(r, tick, i) for i, r in enumerate(recorders)))


async def test_a_batching_wait_gathers_real_time_streams_that_arrive_apart() -> None:
    """Four real-time streams whose frames come in separate loop turns: without a wait
    nearly every model call scores one window; with a wait the calls hold several streams'
    windows, and every probability is the per-stream path's."""
    model = SileroVad()
    audio = clip("en_jfk").samples()[: FRAME * 12]  # 12 frames of 20 ms per stream
    direct = Recorder(DirectScorer(model), audio, 0)
    await run_together([direct])
    per_call = {}
    for delay in (0.0, 0.05):  # the wait outlasts the few loop turns the streams span
        batcher = VadBatcher(model, max_delay=delay)
        streams = [Recorder(batcher, audio, 0) for _ in range(4)]
        await staggered(streams)
        for stream in streams:
            np.testing.assert_allclose(stream.probabilities, direct.probabilities, atol=1e-4)
        per_call[delay] = batcher.windows / batcher.calls
    assert per_call[0.05] >= 1.5 * per_call[0.0], per_call


async def test_a_batching_wait_does_not_pace_a_stream_that_runs_ahead() -> None:
    """A stream sent as fast as it is read (a replay, a burst after a stall) is back before
    any other stream was scored, so it does not wait: 200 frames take far less than
    200 of its waits."""
    model = SileroVad()
    audio = clip("en_jfk").samples()[: FRAME * 200]
    wait = 2.0  # so long that pacing would show: 200 waits are 400 s, the stream ~1 s
    batcher = VadBatcher(model, max_delay=wait)
    fast = Recorder(batcher, audio, 0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await run_together([fast])
    elapsed = loop.time() - started
    assert elapsed < 200 * wait / 4, elapsed
    direct = Recorder(DirectScorer(model), audio, 0)
    await run_together([direct])
    np.testing.assert_allclose(fast.probabilities, direct.probabilities, atol=1e-4)
