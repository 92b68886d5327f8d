"""Offline corpus WER through the file path, per int8 scope and endpoint silence: issue 15's
accuracy guard.

Each of the 28 English corpus clips goes through the server's file path as an upload
does (`session.file_transcriber.FileTranscriber`: Silero VAD, the segmenter, the
committer, the real `BatchScheduler` with its workers and threads as the server plans them,
`--in-flight` requests at once, the upload default being 8), on the real model; the
finals of a clip are joined and scored against its reference. Prints, per scope and
`--min-silence-ms` (the segmenter's endpoint, `PARLEY_MIN_SILENCE_MS`): corpus WER
(`loadgen.wer`, errors over reference words, all clips together), the number of finals,
wall time, and how many clips' text differs from the first row's (`--show`: those clips'
finals, ` | ` between finals; `--errors`: each clip's words that differ from its reference).
`--segmenter KEY=VALUE` sets any other `SegmenterConfig`
field (seconds) for every row.

    python -m bench.file_wer
    python -m bench.file_wer --quantize none int8-shortlist
    python -m bench.file_wer --quantize int8-shortlist --min-silence-ms 500 400 300 --show
    python -m bench.file_wer --quantize int8-shortlist --segmenter soft_max_utterance=4
    python -m bench.file_wer --quantize int8-shortlist --encoder-dtype float32 bfloat16
    python -m bench.file_wer --quantize int8-shortlist --encoder-dtype bfloat16 \\
        --min-silence-ms 400 --errors
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import difflib
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
from engine.choices import QUANTIZE_SCOPES, DType
from engine.loading import load_recognizer, set_torch_threads
from engine.scheduling.scheduler import BatchScheduler
from engine.whisper.recognizer import Quantize, WhisperRecognizerConfig
from loadgen.wer import ErrorCounts, error_counts, normalize
from server.engine_plan import scheduler_config_with
from server.settings import ModelSettings
from session.file_transcriber import FileOptions, FileProgress, FileTranscriber
from session.services import offline_services
from store.memory import MemoryStore

logger = logging.getLogger("bench.file_wer")


@dataclass(frozen=True, slots=True)
class Result:
    quantize: Quantize
    encoder_dtype: DType
    min_silence_ms: float
    errors: ErrorCounts
    seconds: float
    finals: dict[str, list[str]]  # per clip, its finals' texts in order

    def text(self, clip_id: str) -> str:
        return " ".join(self.finals[clip_id])


async def transcribe_clips(
    recognizer_config: WhisperRecognizerConfig,
    segmenter: dict[str, float],
    selected: Sequence[Clip],
    args: argparse.Namespace,
    folder: Path,
) -> tuple[dict[str, list[str]], float]:
    recognizer = load_recognizer(args.model, recognizer_config, cache=args.model_cache)
    recognizer.warmup()
    scheduler = BatchScheduler(
        recognizer,
        scheduler_config_with(workers=args.workers),
        worker_init=lambda: set_torch_threads(args.threads),
    )
    scheduler.start()
    services = offline_services(scheduler, MemoryStore(), recognizer.languages)
    services = dataclasses.replace(
        services,
        segmenter=dataclasses.replace(services.segmenter, **segmenter),
    )
    finals: dict[str, list[str]] = {}
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
            finals[clip.id] = [final.text for final in progress.finals]
    finally:
        await scheduler.stop()
    return finals, time.perf_counter() - started


def differences(reference: str, hypothesis: str) -> list[tuple[str, str]]:
    """The stretches of normalised words where `hypothesis` differs from `reference`, as
    (reference words, hypothesis words), for reading (difflib's alignment, which may
    group an error differently from the WER's)."""
    want, got = normalize(reference), normalize(hypothesis)
    matcher = difflib.SequenceMatcher(a=want, b=got, autojunk=False)
    return [
        (" ".join(want[i1:i2]), " ".join(got[j1:j2]))
        for tag, i1, i2, j1, j2 in matcher.get_opcodes()
        if tag != "equal"
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.file_wer", description=__doc__)
    parser.add_argument("--model", default=ModelSettings().model)
    parser.add_argument(
        "--model-cache",
        type=Path,
        default=Path(os.environ.get("PARLEY_MODEL_CACHE") or Path(ModelSettings().model_cache)),
    )
    parser.add_argument(
        "--quantize",
        nargs="+",
        default=list(QUANTIZE_SCOPES),
        choices=QUANTIZE_SCOPES,
    )
    parser.add_argument(
        "--encoder-dtype",
        nargs="+",
        default=["float32"],
        choices=["float32", "bfloat16"],
        help="the encoder's dtypes to compare (PARLEY_ENCODER_DTYPE; default: float32)",
    )
    parser.add_argument(
        "--min-silence-ms",
        nargs="+",
        type=float,
        default=[500.0],
        help="segmenter endpoint silences to compare (PARLEY_MIN_SILENCE_MS; default: 500)",
    )
    parser.add_argument(
        "--segmenter",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="other SegmenterConfig fields for every row, e.g. soft_pause=0.3",
    )
    parser.add_argument("--workers", type=int, default=2, help="model workers (default: 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--in-flight", type=int, default=8, help="file requests at once")
    parser.add_argument("--show", action="store_true", help="print the clips that differ")
    parser.add_argument(
        "--errors",
        action="store_true",
        help="print, per row, each clip's words that differ from its reference (normalised)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    selected = [clip for clip in clips() if clip.language == "en"]
    fields = {key: float(value) for key, _, value in (s.partition("=") for s in args.segmenter)}
    results: list[Result] = []
    with tempfile.TemporaryDirectory() as folder:
        for scope, encoder, silence in itertools.product(
            args.quantize, args.encoder_dtype, args.min_silence_ms
        ):
            config = WhisperRecognizerConfig(quantize=scope, encoder_dtype=encoder)
            segmenter = {**fields, "min_silence": silence / 1000}
            finals, seconds = asyncio.run(
                transcribe_clips(config, segmenter, selected, args, Path(folder))
            )
            errors = ErrorCounts(0, 0, 0, 0)
            for clip in selected:
                errors += error_counts(clip.reference, " ".join(finals[clip.id]))
            results.append(Result(scope, encoder, silence, errors, seconds, finals))
            print(
                f"{scope}, encoder {encoder}, {silence:g} ms: WER {errors.rate:.4f} "
                f"({errors.errors}/{errors.reference_length}), "
                f"{sum(map(len, finals.values()))} finals, {seconds:.1f} s",
                flush=True,
            )
    audio = sum(clip.duration for clip in selected)
    print(
        f"\n{len(selected)} English clips, {audio:.0f} s of audio, {args.workers} worker(s) x "
        f"{args.threads} thread(s), {args.in_flight} in flight, segmenter "
        f"{' '.join(args.segmenter) or '(defaults)'}\n"
    )
    print(
        "| quantize | encoder | min silence (ms) | WER | errors / words | finals | wall s "
        "| clips differing from the first |"
    )
    print("|---|---|---|---|---|---|---|---|")
    first = results[0]
    for result in results:
        differ = [c.id for c in selected if result.text(c.id) != first.text(c.id)]
        print(
            f"| {result.quantize} | {result.encoder_dtype} | {result.min_silence_ms:g} | "
            f"{result.errors.rate:.4f} | "
            f"{result.errors.errors} / {result.errors.reference_length} | "
            f"{sum(map(len, result.finals.values()))} | {result.seconds:.1f} | {len(differ)} |"
        )
        if args.errors:
            for clip in selected:
                if wrong := differences(clip.reference, result.text(clip.id)):
                    print(f"    {clip.id}: " + "; ".join(f"{a!r} -> {b!r}" for a, b in wrong))
        if args.show:
            for clip_id in differ:
                print(
                    f"    {clip_id}:\n      {' | '.join(first.finals[clip_id])}\n"
                    f"      {' | '.join(result.finals[clip_id])}"
                )


if __name__ == "__main__":
    main()
