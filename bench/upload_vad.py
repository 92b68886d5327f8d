"""Where should an uploaded file's VAD run? Event-loop lag and throughput, measured.

Runs Silero VAD + the segmenter over a few minutes of corpus speech the way an upload job
would, while a ticker task measures how late the event loop wakes it (the lag every live
room would see), for two placements:

- thread:  VAD + segmenter for a chunk of audio in `asyncio.to_thread` (model calls
           straight, one window at a time);
- loop:    the same on the event loop through VadStream + DirectScorer, yielding with
           `await asyncio.sleep(0)` every few windows;
- batcher: the same through the live sessions' VadBatcher (10 ms ticks), a few
           windows per request.

    python -m bench.upload_vad --minutes 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import numpy as np

from session.segmenter import Segmenter, SegmenterConfig, UtteranceEnded
from session.vad import (
    WINDOW,
    DirectScorer,
    SileroVad,
    VadBatcher,
    VadScorer,
    VadState,
    VadStream,
)
from tests.support.corpus import clips

TICK = 0.001


async def ticker(lags: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        before = time.perf_counter()
        await asyncio.sleep(TICK)
        lags.append(time.perf_counter() - before - TICK)


def audio(minutes: float) -> np.ndarray:
    english = [c.samples() for c in clips().values() if c.language == "en"]
    joined = np.concatenate(english)
    reps = int(np.ceil(minutes * 60 * 16_000 / len(joined)))
    return np.tile(joined, reps)[: int(minutes * 60 * 16_000)]


def thread_step(model: SileroVad, state: VadState, seg: Segmenter, samples: np.ndarray) -> int:
    count = 0
    for window in samples[: len(samples) // WINDOW * WINDOW].reshape(-1, WINDOW):
        p = float(model.score(window[None, :], [state])[0])
        count += sum(isinstance(e, UtteranceEnded) for e in seg.push(window, p))
    return count


async def in_thread(model: SileroVad, x: np.ndarray, chunk_s: float) -> int:
    state, seg = VadState(), Segmenter(SegmenterConfig(partial_interval=0))
    n = int(chunk_s * 16_000) // WINDOW * WINDOW
    total = 0
    for i in range(0, len(x), n):
        total += await asyncio.to_thread(thread_step, model, state, seg, x[i : i + n])
    return total


async def in_loop(scorer: VadScorer, x: np.ndarray, every: int) -> int:
    vad, seg = VadStream(scorer), Segmenter(SegmenterConfig(partial_interval=0))
    n = every * WINDOW
    total = 0
    for i in range(0, len(x), n):
        for window, p in await vad.process(x[i : i + n]):
            total += sum(isinstance(e, UtteranceEnded) for e in seg.push(window, p))
        await asyncio.sleep(0)
    return total


async def measure(name: str, work: asyncio.Future[int] | asyncio.Task[int], seconds: float) -> None:
    lags: list[float] = []
    stop = asyncio.Event()
    tick = asyncio.create_task(ticker(lags, stop))
    started = time.perf_counter()
    utterances = await work
    wall = time.perf_counter() - started
    stop.set()
    await tick
    lags.sort()
    p99 = lags[int(len(lags) * 0.99)] * 1000
    print(
        f"{name:<22} {wall:6.2f} s wall  {seconds / wall:6.0f}x real time  "
        f"{wall / (seconds * 16_000 / WINDOW) * 1e6:5.0f} µs/window  "
        f"loop lag p50 {statistics.median(lags) * 1000:5.2f} ms  p99 {p99:5.2f} ms  "
        f"max {lags[-1] * 1000:6.2f} ms  ({utterances} utterances)"
    )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=3.0)
    args = parser.parse_args()
    model = SileroVad()
    x = audio(args.minutes)
    seconds = len(x) / 16_000
    print(f"{seconds:.0f} s of speech, {len(x) // WINDOW} windows")
    for chunk in (10.0, 1.0):
        task = asyncio.create_task(in_thread(model, x, chunk))
        await measure(f"thread, {chunk:g} s chunks", task, seconds)
    for every in (1, 2, 4, 8, 16):
        task = asyncio.create_task(in_loop(DirectScorer(model), x, every))
        await measure(f"loop, yield every {every}", task, seconds)
    for every in (4, 32):
        task = asyncio.create_task(in_loop(VadBatcher(model), x, every))
        await measure(f"batcher, {every} a request", task, seconds)


if __name__ == "__main__":
    asyncio.run(main())
