"""What a final's left context costs, and where: the encoder's longer window or the decoder.

    python -m bench.context_cost --sets dialogue meeting --caps 0 4 6 8 10 20 --windows 10 15 20

Each track of a `bench.quality` set is cut as the file path cuts it (`bench.segments`);
every utterance is decoded once alone to get the finals its successors' contexts carry.
Then, per context cap (`PARLEY_LEFT_CONTEXT_S`: at most two previous utterances with their
gaps as zeros, at most that many seconds) and context window (`context_window`), every
utterance that has a context is decoded behind it, one at a time (batch 1), on one thread
in the server's default precision (a server worker: 1 thread, int8-shortlist on the CPU),
and the mean time a final is printed with the windows used. The breakdown row (the
largest cap) times, per utterance that got a context: the encoder over its own window and
over the context's, and the whole final alone in its own window, alone in the context's
window, and behind its context: the window's cost (encoder and the decoder's longer
cross-attention) and the context text's (forced tokens in the decoder) apart.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import time
from collections.abc import Callable
from functools import partial

import numpy as np
import torch

from bench.quality import MODELS, SETS, Track
from bench.segments import Segment, segments
from engine.api import SAMPLE_RATE, LeftContext, Utterance
from engine.choices import Quantize
from engine.whisper import context
from engine.whisper.int8 import int8_available
from engine.whisper.recognizer import WhisperRecognizer, WhisperRecognizerConfig
from engine.whisper.weights import resolve_model
from session.said_before import LEFT_UTTERANCES, MAX_GAP
from session.segmenter import SegmenterConfig
from session.vad import SileroVad


def left_of(
    audio: np.ndarray, segs: list[Segment], texts: list[str], i: int, cap: float
) -> LeftContext | None:
    """Utterance i's context as `SaidBefore` builds it: up to LEFT_UTTERANCES previous
    utterances with text, each with its gap (zeros, at most MAX_GAP), at most `cap` s."""
    pieces: list[np.ndarray] = []
    said: list[str] = []
    built: LeftContext | None = None
    seconds = 0.0
    for k in range(i - 1, max(-1, i - 1 - LEFT_UTTERANCES), -1):
        if not texts[k]:
            break
        gap = min(segs[k + 1].start - segs[k].end, round(MAX_GAP * SAMPLE_RATE))
        seconds += (segs[k].end - segs[k].start + gap) / SAMPLE_RATE
        if seconds > cap:
            break
        pieces[:0] = [audio[segs[k].start : segs[k].end], np.zeros(gap, np.float32)]
        said.insert(0, texts[k])
        built = LeftContext(np.concatenate(pieces), " ".join(said), shorter=built)
    return built


def timed(call: Callable[[], object], repeats: int) -> float:
    """The fastest of `repeats` calls, seconds."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", nargs="+", default=["dialogue", "meeting"], choices=list(SETS))
    parser.add_argument("--caps", nargs="+", type=float, default=[0, 4, 6, 8, 10, 20])
    parser.add_argument("--windows", nargs="+", type=float, default=[10, 15, 20])
    parser.add_argument("--repeats", type=int, default=2, help="time each call this often")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    quantize: Quantize = "int8-shortlist" if int8_available() else "none"
    model_path = resolve_model("tiny.en", MODELS)
    recognizers = {
        window: WhisperRecognizer(
            model_path, WhisperRecognizerConfig(quantize=quantize, context_window=window)
        )
        for window in args.windows
    }
    plain = recognizers[max(args.windows)]
    vad = SileroVad()
    config = SegmenterConfig(min_silence=0.4, partial_interval=0.0)
    print(f"{args.threads} thread(s), {quantize}, best of {args.repeats}", flush=True)
    for name in args.sets:
        tracks = SETS[name]()
        cut = [(t, await segments(t, vad, config)) for t in tracks]
        finals = {
            t.id: [plain.transcribe([Utterance(t.audio[s.start : s.end])])[0].text for s in segs]
            for t, segs in cut
        }
        rows = [(t, segs, i) for t, segs in cut for i in range(1, len(segs)) if finals[t.id][i - 1]]
        print(f"== {name}: {sum(len(s) for _, s in cut)} utterances, {len(rows)} after one")
        for window in args.windows:
            r = recognizers[window]
            room = min(window, 30.0) - r.config.window_margin
            for cap in args.caps:
                if cap == 0 and window != args.windows[0]:
                    continue  # no context: the same in every window cap
                costs, used, with_context = [], [], 0
                for t, segs, i in rows:
                    s = segs[i]
                    left = left_of(t.audio, segs, finals[t.id], i, cap) if cap else None
                    u = context.fitted(Utterance(t.audio[s.start : s.end], left=left), room)
                    with_context += u.left is not None
                    used.append(r.window([u]))
                    costs.append(timed(partial(r.transcribe, [u]), args.repeats))
                counts = " ".join(f"{w:.0f}s:{used.count(w)}" for w in sorted(set(used)))
                print(
                    f"  window cap {window:4.0f} s, context cap {cap:4.0f} s: "
                    f"{statistics.mean(costs) * 1000:4.0f} ms a final (P50 "
                    f"{statistics.median(costs) * 1000:4.0f}), {with_context}/{len(rows)} "
                    f"with context, windows {counts}",
                    flush=True,
                )
        breakdown(recognizers[max(args.windows)], rows, finals, max(args.caps), args.repeats)


Row = tuple[Track, list[Segment], int]


def breakdown(
    r: WhisperRecognizer, rows: list[Row], finals: dict[str, list[str]], cap: float, repeats: int
) -> None:
    """Per final with a context (cap `cap`): the encoder over its own window and the
    context's, the final alone in each, and behind its context."""
    room = min(r.config.context_window, 30.0) - r.config.window_margin
    keys = ("encoder, own window", "encoder, context's", "alone", "alone, context's window")
    parts: dict[str, list[float]] = {k: [] for k in (*keys, "behind context")}
    for t, segs, i in rows:
        s = segs[i]
        left = left_of(t.audio, segs, finals[t.id], i, cap)
        u = context.fitted(Utterance(t.audio[s.start : s.end], left=left), room)
        if u.left is None:
            continue
        alone = dataclasses.replace(u, left=None)
        own, wide = r.window([alone]), r.window([u])
        for key, window in zip(keys[:2], (own, wide), strict=True):
            features = r.preprocess([alone], window)
            parts[key].append(timed(partial(r.whisper.encoders.encode, window, features), repeats))
        parts["alone"].append(timed(partial(r.forward, [alone], own), repeats))
        parts["alone, context's window"].append(timed(partial(r.forward, [alone], wide), repeats))
        parts["behind context"].append(timed(partial(r.forward, [u], wide), repeats))
    print(f"  breakdown, {len(parts['alone'])} finals with a context (cap {cap:.0f} s):")
    for key, values in parts.items():
        print(f"    {key:26s} {statistics.mean(values) * 1000:5.0f} ms", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
