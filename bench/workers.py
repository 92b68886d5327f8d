"""Model workers on the CPU: one worker with all torch threads, or N workers of one thread
each, as threads of one process or as separate processes.

Each worker runs the same batches of short corpus utterances (4-7 s, each with the draft
a live session's latest partial would give it) back to back; the figure is the audio
seconds the workers transcribe together per wall second, and the median wall time of a
batch. Threads share one Python interpreter: torch releases the GIL inside each
operation, but the Python between operations (a decoder step is ~150 small operations)
holds it, so two threads may not run twice as fast. Processes do not share the GIL.

    python -m bench.workers --batch-sizes 1 4 --seconds 30
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import torch

from bench.corpus import clips
from engine.api import Utterance
from engine.loading import load_recognizer
from engine.whisper.recognizer import WhisperRecognizer
from server.settings import ModelSettings


@dataclass(frozen=True, slots=True)
class Result:
    audio_seconds: float
    batch_seconds: list[float]


def utterances() -> list[Utterance]:
    chosen = [c for c in clips() if c.language == "en" and 4.0 <= c.duration <= 7.0]
    return [Utterance(c.audio()) for c in chosen]


def drafted(recognizer: WhisperRecognizer, plain: Sequence[Utterance]) -> list[Utterance]:
    heads = [Utterance(u.audio[: len(u.audio) * 4 // 5]) for u in plain]
    texts = [t.text for t in recognizer.transcribe(heads)]
    return [dataclasses.replace(u, draft=t) for u, t in zip(plain, texts, strict=True)]


def work(
    recognizer: WhisperRecognizer, batch: Sequence[Utterance], start: float, seconds: float
) -> Result:
    """Run `batch` again and again from `start` (perf_counter) for `seconds`."""
    while time.perf_counter() < start:
        time.sleep(0.001)
    audio, times = 0.0, []
    while time.perf_counter() < start + seconds:
        began = time.perf_counter()
        recognizer.transcribe(batch)
        times.append(time.perf_counter() - began)
        audio += sum(u.duration for u in batch)
    return Result(audio, times)


def _process_main(
    model: str, batch_size: int, offset: int, start: float, seconds: float, out: Connection
) -> None:
    torch.set_num_threads(1)
    recognizer = load_recognizer(model, cache=Path(ModelSettings().model_cache))
    recognizer.warmup()
    pool = drafted(recognizer, utterances())
    batch = [pool[(offset + i) % len(pool)] for i in range(batch_size)]
    recognizer.transcribe(batch)
    out.send(work(recognizer, batch, start, seconds))


def run_threads(
    recognizers: Sequence[WhisperRecognizer],
    batches: Sequence[Sequence[Utterance]],
    threads_each: int,
    seconds: float,
) -> list[Result]:
    results: list[Result | None] = [None] * len(recognizers)
    start = time.perf_counter() + 0.5

    def one(index: int) -> None:
        torch.set_num_threads(threads_each)  # per OS thread with OpenMP
        results[index] = work(recognizers[index], batches[index], start, seconds)

    workers = [threading.Thread(target=one, args=(i,)) for i in range(len(recognizers))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return [r for r in results if r is not None]


def run_processes(model: str, count: int, batch_size: int, seconds: float) -> list[Result]:
    context = multiprocessing.get_context("spawn")
    pipes = [context.Pipe(duplex=False) for _ in range(count)]
    start = time.perf_counter() + 60.0  # time for the children to load and warm up
    children = [
        context.Process(
            target=_process_main, args=(model, batch_size, i * batch_size, start, seconds, send)
        )
        for i, (_, send) in enumerate(pipes)
    ]
    for child in children:
        child.start()
    results = [receive.recv() for receive, _ in pipes]
    for child in children:
        child.join()
    return results


def line(label: str, batch_size: int, results: Sequence[Result], seconds: float) -> str:
    audio = sum(r.audio_seconds for r in results)
    times = [t for r in results for t in r.batch_seconds]
    return (
        f"| {label} | {batch_size} | {audio / seconds:.1f}x | "
        f"{statistics.median(times):.3f} s | {len(times)} |"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=ModelSettings().model)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--seconds", type=float, default=30.0, help="per configuration")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.workers)
    cache = Path(ModelSettings().model_cache)
    recognizers = [load_recognizer(args.model, cache=cache) for _ in range(args.workers)]
    for recognizer in recognizers:
        recognizer.warmup()
    pool = drafted(recognizers[0], utterances())
    print(f"{args.model}, {args.seconds:g} s per configuration, {torch.__version__}")
    print("| workers | batch | audio s per wall s | batch wall time (median) | batches |")
    print("|---|---|---|---|---|")
    for size in args.batch_sizes:
        batches = [
            [pool[(w * size + i) % len(pool)] for i in range(size)] for w in range(args.workers)
        ]
        for recognizer, batch in zip(recognizers, batches, strict=False):
            recognizer.transcribe(batch)
        one = run_threads(recognizers[:1], batches[:1], args.workers, args.seconds)
        print(line(f"1 worker, {args.workers} torch threads", size, one, args.seconds), flush=True)
        single = run_threads(recognizers[:1], batches[:1], 1, args.seconds)
        print(line("1 worker, 1 torch thread", size, single, args.seconds), flush=True)
        threads = run_threads(recognizers, batches, 1, args.seconds)
        label = f"{args.workers} threads, 1 torch thread each"
        print(line(label, size, threads, args.seconds), flush=True)
        processes = run_processes(args.model, args.workers, size, args.seconds)
        label = f"{args.workers} processes, 1 torch thread each"
        print(line(label, size, processes, args.seconds), flush=True)


if __name__ == "__main__":
    main()
