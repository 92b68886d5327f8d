"""A model worker's memory under a replay of live batch shapes, and where it sits (issue 44).

    python -m bench.worker_memory --minutes 20
    ONEDNN_PRIMITIVE_CACHE_CAPACITY=64 python -m bench.worker_memory --minutes 20
    MALLOC_ARENA_MAX=1 python -m bench.worker_memory --minutes 20 --seed 2

The 2-hour soak saw each model worker's minute floor rise ~50-70 MiB (docs/history/
2026-12-07-soak-2h.md) while the server stayed flat. This bench is one worker without the
server: it decodes random batches as a worker does (the server's default model settings,
one torch thread, `malloc_trim` every 60 s as engine/workers/child.py does) at full speed,
so it meets in minutes the shapes a soak meets in hours: partials of 1-12 s; finals with a
draft, word timings and, one in three, a left context of 2-10 s; 1-8 rows a batch. Each
minute it reports the lowest RSS and where the memory sits: glibc's heap (mallinfo2: in
use, free), anonymous mappings outside it (how many, and how many executable: JIT kernels)
and file-backed; at the end the slope of the minute floors after `--warmup` minutes (the
issue's measure). Environment variables set before it starts (oneDNN's cache capacity,
glibc's arena count) are the settings under test: compare runs of one seed.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from bench.corpus import clips
from bench.processes import status_kb
from bench.soak import floor_slope
from engine.api import SAMPLE_RATE, AudioArray, LeftContext, Utterance
from engine.loading import load_whisper
from engine.memory import malloc_trim
from server.engine_plan import model_config
from server.settings import Settings

MIB = 1024 * 1024
TRIM_INTERVAL_S = 60.0  # engine/workers/processes.py's default


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def _mallinfo2() -> _MallInfo2:
    """glibc's heap statistics, summed over its arenas."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    info: _MallInfo2 = libc.mallinfo2()
    return info


@dataclass(frozen=True, slots=True)
class Where:
    """Where a process's resident memory sits, in MiB (counts as counts)."""

    rss: float
    heap_used: float  # glibc: allocated (uordblks + hblkhd: mmapped chunks)
    heap_free: float  # glibc: free in its arenas (fordblks)
    anon: float  # resident anonymous mappings (the heap's included)
    anon_maps: int
    exec_anon_maps: int  # anonymous and executable: JIT-compiled kernels
    files: float  # resident file-backed mappings (libraries, weights)


def where() -> Where:
    """This process's memory now (/proc/self/smaps and glibc's mallinfo2)."""
    anon = files = 0.0
    anon_maps = exec_maps = 0
    anonymous, executable = False, False
    with open("/proc/self/smaps", encoding="ascii", errors="replace") as smaps:
        for line in smaps:
            head = line.split()
            if not head:
                continue
            if "-" in head[0] and len(head) >= 5:  # a mapping's first line
                path = head[5] if len(head) > 5 else ""
                anonymous = path in ("", "[heap]") or path.startswith("[anon")
                executable = "x" in head[1]
                anon_maps += anonymous
                exec_maps += anonymous and executable and path == ""
            elif head[0] == "Rss:":
                if anonymous:
                    anon += int(head[1]) / 1024
                else:
                    files += int(head[1]) / 1024
    info = _mallinfo2()
    return Where(
        rss=rss_mib(),
        heap_used=(info.uordblks + info.hblkhd) / MIB,
        heap_free=info.fordblks / MIB,
        anon=anon,
        anon_maps=anon_maps,
        exec_anon_maps=exec_maps,
        files=files,
    )


def rss_mib() -> float:
    """This process's resident memory now."""
    return status_kb(os.getpid(), "VmRSS:") / 1024


class FloorSampler:
    """Each minute's lowest RSS, sampled every second in a thread."""

    def __init__(self) -> None:
        self.floors: dict[int, float] = {}
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            rss = rss_mib()
            minute = int((time.monotonic() - self._started) // 60)
            self.floors[minute] = min(rss, self.floors.get(minute, rss))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def batch(rng: random.Random, audio: Sequence[AudioArray], texts: Sequence[str]) -> list[Utterance]:
    """Random rows of one kind, as a worker gets them: partials, or finals (a draft, word
    timings, and one in three behind a left context)."""
    partial = rng.random() < 0.6
    rows = []
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(audio))
        seconds = rng.uniform(1.0, min(12.0, len(audio[i]) / SAMPLE_RATE))
        clip = audio[i][: int(seconds * SAMPLE_RATE)]
        if partial:
            rows.append(Utterance(clip, partial=True))
            continue
        words = texts[i].split()
        draft = " ".join(words[: int(len(words) * seconds / (len(audio[i]) / SAMPLE_RATE) * 0.8)])
        left = None
        if rng.random() < 1 / 3:
            j = rng.randrange(len(audio))
            context = audio[j][: int(rng.uniform(2.0, 10.0) * SAMPLE_RATE)]
            left = LeftContext(context, " ".join(texts[j].split()[:8]))
        rows.append(Utterance(clip, draft=draft, word_timings=True, left=left))
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--warmup", type=int, default=3, help="minutes left out of the slope")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)

    recognizer = load_whisper(model_config(Settings()))
    torch.set_num_threads(1)  # what each CPU model worker has (engine/loading.py worker_plan)
    recognizer.warmup()
    english = [clip for clip in clips(("en_",)) if clip.duration > 1.5]
    audio = [clip.audio() for clip in english]
    texts = [clip.reference for clip in english]
    rng = random.Random(args.seed)
    trim = malloc_trim()
    sampler = FloorSampler()
    started = trimmed = reported = time.monotonic()
    batches = 0
    print("minute | floor MiB | heap used | heap free | anon | anon maps | exec anon | files")
    while (now := time.monotonic()) - started < args.minutes * 60:
        recognizer.transcribe(batch(rng, audio, texts))
        batches += 1
        if trim is not None and now - trimmed >= TRIM_INTERVAL_S:
            trim()
            trimmed = now
        if now - reported >= 60:
            reported = now
            minute = int((now - started) // 60)
            w = where()
            floor = sampler.floors.get(minute - 1, w.rss)
            print(
                f"{minute} | {floor:.0f} | {w.heap_used:.0f} | {w.heap_free:.0f} | {w.anon:.0f}"
                f" | {w.anon_maps} | {w.exec_anon_maps} | {w.files:.0f}",
                flush=True,
            )
    sampler.stop()
    whole = int((time.monotonic() - started) // 60)  # the last minute is cut short
    floors = {minute: mib for minute, mib in sampler.floors.items() if minute < whole}
    slope = floor_slope({minute: mib for minute, mib in floors.items() if minute >= args.warmup})
    first, last = min(floors), max(floors)
    print(
        f"{batches} batches; floor {floors[first]:.0f} -> {floors[last]:.0f} MiB; "
        f"slope after minute {args.warmup}: {slope:+.2f} %/h"
    )


if __name__ == "__main__":
    main()
