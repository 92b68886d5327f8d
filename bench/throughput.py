"""Recognizer throughput: audio seconds transcribed per wall second, by batch size.

Runs the same batches of short corpus utterances (about 5 s each) through the recognizer
padded to Whisper's 30 s window, with the default window buckets, and (on CPU) with
int8 linear layers too; the "drafts" modes set each utterance's draft (`Utterance.draft`)
to the text of its first 80 %, as a live session's last partial would give it. Prints a
markdown table of the median wall time per batch and the real-time factor.

    python -m bench.throughput --threads 2
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.corpus import Clip, clips
from engine.api import Utterance
from engine.loading import load_recognizer
from engine.whisper.int8 import int8_available
from engine.whisper.recognizer import WhisperRecognizer, WhisperRecognizerConfig
from server.settings import ModelSettings

logger = logging.getLogger("bench.throughput")


@dataclass(frozen=True, slots=True)
class Settings:
    model: str
    model_cache: Path
    device: str
    threads: int
    batch_sizes: tuple[int, ...]
    repeats: int
    min_duration: float
    max_duration: float


@dataclass(frozen=True, slots=True)
class Measurement:
    batch_size: int
    audio_seconds: float
    wall_seconds: float  # median over repeats

    @property
    def speed(self) -> float:
        return self.audio_seconds / self.wall_seconds


def parse_args(argv: Sequence[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(
        prog="python -m bench.throughput",
        description="Audio seconds per wall second of the Whisper recognizer, "
        "30 s padding vs window buckets, at several batch sizes.",
    )
    parser.add_argument("--model", default=ModelSettings().model, help="model spec")
    parser.add_argument(
        "--model-cache",
        type=Path,
        default=Path(os.environ.get("PARLEY_MODEL_CACHE") or Path(ModelSettings().model_cache)),
        help="where packaged models are converted to (default: $PARLEY_MODEL_CACHE or "
        f"{Path(ModelSettings().model_cache)})",
    )
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default: 2)")
    parser.add_argument(
        "--batch-sizes", type=int, nargs="+", default=[1, 4, 8, 16], help="default: 1 4 8 16"
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs per batch (default: 3)")
    parser.add_argument("--min-duration", type=float, default=4.0, help="shortest clip, s")
    parser.add_argument("--max-duration", type=float, default=7.0, help="longest clip, s")
    args = parser.parse_args(argv)
    return Settings(
        model=args.model,
        model_cache=args.model_cache,
        device=args.device,
        threads=args.threads,
        batch_sizes=tuple(args.batch_sizes),
        repeats=args.repeats,
        min_duration=args.min_duration,
        max_duration=args.max_duration,
    )


def select_clips(settings: Settings) -> list[Clip]:
    selected = [
        clip
        for clip in clips()
        if clip.language == "en" and settings.min_duration <= clip.duration <= settings.max_duration
    ]
    if not selected:
        raise SystemExit("no English corpus clips in the duration range")
    return selected


def with_drafts(recognizer: WhisperRecognizer, utterances: Sequence[Utterance]) -> list[Utterance]:
    """Each utterance with the text of its first 80 % as its draft."""
    heads = [Utterance(u.audio[: len(u.audio) * 4 // 5], u.language) for u in utterances]
    texts = [result.text for result in recognizer.transcribe(heads)]
    return [dataclasses.replace(u, draft=text) for u, text in zip(utterances, texts, strict=True)]


def measure(
    recognizer: WhisperRecognizer, utterances: Sequence[Utterance], batch_size: int, repeats: int
) -> Measurement:
    batch = [utterances[i % len(utterances)] for i in range(batch_size)]
    recognizer.transcribe(batch)  # first run of this shape: allocator and kernel warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        recognizer.transcribe(batch)
        times.append(time.perf_counter() - start)
    audio = sum(utterance.duration for utterance in batch)
    return Measurement(batch_size, audio, statistics.median(times))


def run(settings: Settings) -> str:
    torch.set_num_threads(settings.threads)
    selected = select_clips(settings)
    utterances = [Utterance(clip.audio()) for clip in selected]
    mean = sum(clip.duration for clip in selected) / len(selected)
    cpu = torch.device(settings.device).type == "cpu"
    modes: dict[str, tuple[WhisperRecognizerConfig, bool]] = {
        "30 s window": (WhisperRecognizerConfig(device=settings.device, windows=(30.0,)), False),
        "window buckets": (WhisperRecognizerConfig(device=settings.device), False),
        "buckets, drafts": (WhisperRecognizerConfig(device=settings.device), True),
    }
    if cpu and int8_available():
        modes["buckets, int8"] = (WhisperRecognizerConfig(quantize="int8"), False)
        modes["buckets, int8, drafts"] = (WhisperRecognizerConfig(quantize="int8"), True)
    columns: dict[str, list[Measurement]] = {}
    headers = []
    for label, (config, drafted) in modes.items():
        recognizer = load_recognizer(settings.model, config, cache=settings.model_cache)
        recognizer.warmup()
        batch = with_drafts(recognizer, utterances) if drafted else utterances
        headers.append(f"{label} ({'/'.join(f'{w:g}' for w in recognizer.windows)} s)")
        columns[label] = []
        for size in settings.batch_sizes:
            result = measure(recognizer, batch, size, settings.repeats)
            logger.info("%s batch %d: %.2f s", label, size, result.wall_seconds)
            columns[label].append(result)
    lines = [
        f"{settings.model} on {settings.device}, {settings.threads} torch threads, "
        f"{len(selected)} English clips of {settings.min_duration:g}-{settings.max_duration:g} s "
        f"(mean {mean:.1f} s); median of {settings.repeats} runs: wall seconds per batch "
        "(audio seconds per wall second)",
        "",
        "| batch | " + " | ".join(headers) + " |",
        "|---|" + "---|" * len(headers),
    ]
    for row, size in enumerate(settings.batch_sizes):
        cells = [
            f"{m.wall_seconds:.2f} s ({m.speed:.1f}x)" for m in (c[row] for c in columns.values())
        ]
        lines.append(f"| {size} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    settings = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    print(run(settings))


if __name__ == "__main__":
    main()
