"""What word timings cost a final: the recognizer with and without them, same batches.

    python -m bench.words --threads 2

Transcribes the 16 English corpus clips (LibriSpeech, JFK, LJ Speech; 1.8-16.7 s) one at
a time and in batches of 8, every utterance asking for word timings or none, alternating
runs; reports the median wall time per pass over the clips, the difference, and the time
spent inside `Aligner.align` (the extra decoder pass, the DTW and the word splitting).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.corpus import clips
from engine.api import Utterance, WordTiming
from engine.loading import load_recognizer
from engine.whisper import alignment
from engine.whisper.int8 import int8_available
from engine.whisper.recognizer import WhisperRecognizer, WhisperRecognizerConfig
from server.settings import ModelSettings

ENGLISH = ("en_ls_", "en_jfk", "en_lj_LJ0")


class AlignTimer:
    """Wraps `Aligner.align` to add up the seconds spent in it."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._align = alignment.Aligner.align

        def timed(aligner: alignment.Aligner, *args: Any) -> list[tuple[WordTiming, ...]]:
            start = time.perf_counter()
            try:
                return self._align(aligner, *args)
            finally:
                self.seconds += time.perf_counter() - start

        alignment.Aligner.align = timed  # type: ignore[method-assign,assignment]


def one_pass(recognizer: WhisperRecognizer, audio: Sequence[Any], size: int, words: bool) -> float:
    start = time.perf_counter()
    for i in range(0, len(audio), size):
        recognizer.transcribe([Utterance(a, word_timings=words) for a in audio[i : i + size]])
    return time.perf_counter() - start


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.words", description=__doc__)
    parser.add_argument("--model", default=ModelSettings().model)
    parser.add_argument(
        "--model-cache",
        type=Path,
        default=Path(os.environ.get("PARLEY_MODEL_CACHE") or Path(ModelSettings().model_cache)),
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    audio = [clip.audio() for clip in clips(ENGLISH)]
    timer = AlignTimer()
    configs = {"float32": WhisperRecognizerConfig(quantize="none")}
    if int8_available():
        configs["int8-decoder"] = WhisperRecognizerConfig(quantize="int8-decoder")
    print(f"{args.model}, {args.threads} torch threads, {len(audio)} English clips")
    print("| layers | batch | without words | with words | difference | in align |")
    print("|---|---|---|---|---|---|")
    for name, config in configs.items():
        recognizer = load_recognizer(args.model, config, cache=args.model_cache)
        recognizer.warmup()
        one_pass(recognizer, audio, 8, True)  # first shapes: allocator and kernels warm
        for size in (1, 8):
            plain: list[float] = []
            worded: list[float] = []
            aligning: list[float] = []
            for _ in range(args.repeats):
                plain.append(one_pass(recognizer, audio, size, False))
                timer.seconds = 0.0
                worded.append(one_pass(recognizer, audio, size, True))
                aligning.append(timer.seconds)
            off, on = statistics.median(plain), statistics.median(worded)
            inside = statistics.median(aligning)
            print(
                f"| {name} | {size} | {off:.2f} s | {on:.2f} s | {100 * (on - off) / off:+.1f} % "
                f"| {inside:.2f} s ({100 * inside / on:.1f} % of the pass) |"
            )


if __name__ == "__main__":
    main()
