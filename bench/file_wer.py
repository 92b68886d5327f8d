"""Offline corpus WER through the file path, per int8 scope: issue 15's accuracy guard.

Each of the 28 English corpus clips goes through the server's file path as an upload
does (`session.file_transcriber.FileTranscriber`: Silero VAD, the segmenter, the
committer, the real `BatchScheduler` with its workers and threads as the server plans them,
`--in-flight` requests at once, the upload default being 8), on the real model; the
finals of a clip are joined and scored against its reference. Prints, per scope: corpus
WER (`loadgen.wer`, errors over reference words, all clips together), wall time, and how
many clips' text differs from the first scope's.

    python -m bench.file_wer
    python -m bench.file_wer --quantize none int8-decoder
    python -m bench.file_wer --quantize none --min-silence-ms 500 400 300   # endpointing
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.corpus import Clip, clips
from engine.loading import DEFAULT_CACHE, DEFAULT_MODEL, load_recognizer, set_torch_threads
from engine.scheduler import BatchScheduler
from engine.whisper import Quantize, WhisperRecognizerConfig
from loadgen.wer import ErrorCounts, error_counts
from session.file_transcriber import FileOptions, FileProgress, FileTranscriber
from session.segmenter import SegmenterConfig
from session.services import SessionServices
from session.vad import DirectScorer, SileroVad
from store.memory import MemoryStore

logger = logging.getLogger("bench.file_wer")


@dataclass(frozen=True, slots=True)
class Result:
    quantize: Quantize
    min_silence_ms: float
    errors: ErrorCounts
    seconds: float
    texts: dict[str, str]
    finals: int


async def transcribe_clips(
    recognizer_config: WhisperRecognizerConfig,
    selected: Sequence[Clip],
    args: argparse.Namespace,
    folder: Path,
    min_silence_ms: float = 500.0,
) -> tuple[dict[str, str], float, int]:
    recognizer = load_recognizer(args.model, recognizer_config, cache=args.model_cache)
    recognizer.warmup()
    scheduler = BatchScheduler(
        recognizer,
        workers=args.workers,
        worker_init=lambda: set_torch_threads(args.threads),
    )
    scheduler.start()
    services = SessionServices(
        scheduler=scheduler,
        store=MemoryStore(),
        vad=DirectScorer(SileroVad()),
        segmenter=SegmenterConfig(min_silence=min_silence_ms / 1000),
        max_frame_bytes=1 << 20,
        outbox_limit=100,
        languages=recognizer.languages,
    )
    texts: dict[str, str] = {}
    finals = 0
    started = time.perf_counter()
    try:
        for clip in selected:
            samples = clip.audio()
            path = folder / f"{clip.id}.s16"
            path.write_bytes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
            progress = FileProgress(total_samples=len(samples))
            options = FileOptions(
                f"file-{clip.id}", "speaker", "en", in_flight=lambda: args.in_flight
            )
            await FileTranscriber(path, services, options, progress).run()
            texts[clip.id] = " ".join(final.text for final in progress.finals)
            finals += len(progress.finals)
    finally:
        await scheduler.stop()
    return texts, time.perf_counter() - started, finals


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.file_wer", description=__doc__)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument(
        "--model-cache",
        type=Path,
        default=Path(os.environ.get("PARLEY_MODEL_CACHE") or DEFAULT_CACHE),
    )
    parser.add_argument(
        "--quantize",
        nargs="+",
        default=["none", "int8-decoder", "int8"],
        choices=["none", "int8-decoder", "int8"],
    )
    parser.add_argument("--workers", type=int, default=2, help="model workers (default: 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--in-flight", type=int, default=8, help="file requests at once")
    parser.add_argument("--show", action="store_true", help="print the clips that differ")
    parser.add_argument(
        "--min-silence-ms",
        type=float,
        nargs="+",
        default=[500.0],
        help="the segmenter's endpoint silence (PARLEY_MIN_SILENCE_MS); each value one run",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    selected = [clip for clip in clips() if clip.language == "en"]
    results: list[Result] = []
    with tempfile.TemporaryDirectory() as folder:
        for scope, silence in itertools.product(args.quantize, args.min_silence_ms):
            config = WhisperRecognizerConfig(quantize=scope)
            texts, seconds, finals = asyncio.run(
                transcribe_clips(config, selected, args, Path(folder), silence)
            )
            errors = ErrorCounts(0, 0, 0, 0)
            for clip in selected:
                errors += error_counts(clip.reference, texts[clip.id])
            results.append(Result(scope, silence, errors, seconds, texts, finals))
            print(
                f"{scope}, min silence {silence:.0f} ms: WER {errors.rate:.4f} "
                f"({errors.errors}/{errors.reference_length}), {finals} finals, {seconds:.1f} s",
                flush=True,
            )
    audio = sum(clip.duration for clip in selected)
    print(
        f"\n{len(selected)} English clips, {audio:.0f} s of audio, {args.workers} worker(s) x "
        f"{args.threads} thread(s), {args.in_flight} in flight\n"
    )
    print(
        "| quantize | min silence (ms) | WER | errors / words | finals | wall s "
        "| clips differing from the first |"
    )
    print("|---|---|---|---|---|---|---|")
    first = results[0].texts
    for result in results:
        differ = [c.id for c in selected if result.texts[c.id] != first[c.id]]
        print(
            f"| {result.quantize} | {result.min_silence_ms:.0f} | {result.errors.rate:.4f} | "
            f"{result.errors.errors} / {result.errors.reference_length} | {result.finals} | "
            f"{result.seconds:.1f} | {len(differ)} |"
        )
        if args.show:
            for clip_id in differ:
                print(f"    {clip_id}:\n      {first[clip_id]}\n      {result.texts[clip_id]}")


if __name__ == "__main__":
    main()
