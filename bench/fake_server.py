"""`python -m bench.fake_server`: the Parley server exactly as `python -m server` runs it
(same settings, uvicorn config, store, VAD, scheduler, drain), with a stand-in for the
speech model that takes a set time per batch.

For benchmarks of everything but the model (faults, leaks, the front end's CPU, the
scheduler's policy on a GPU's costs) on a machine whose CPU cannot run the real model for
many rooms: the model's time is simulated with a sleep on the scheduler's worker thread
(which holds no GIL, as a GPU's kernels do not), stopped at the next 5 ms when the
scheduler says stop, as the real decoder stops at its next step. A batch of n takes
`PARLEY_FAKE_BATCH_MS` + n x `PARLEY_FAKE_UTTERANCE_MS`, or, with
`PARLEY_FAKE_BATCH_TABLE` (`size:ms,...`), the table's time interpolated linearly between
its sizes (beyond its ends: the end's time per row). `H200_TINY_EN` is one NVIDIA H200's
tiny.en float16 row (docs/history/2026-12-04-gpu-h200.md):

    PARLEY_FAKE_BATCH_TABLE=1:138,2:109,4:104,8:121,16:134,32:195,64:353 \\
        PARLEY_MODEL_WORKERS=1 python -m bench.fake_server --port 8000

Each text is `n=<samples>`, so a transcript says which audio it covers.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections.abc import Callable, Sequence

from engine.api import Transcription, Utterance
from engine.recognizer import Interrupted
from server.__main__ import main
from server.settings import Settings

H200_TINY_EN = "1:138,2:109,4:104,8:121,16:134,32:195,64:353"
STEP = 0.005  # seconds between looks at `should_stop`


def batch_table(text: str) -> list[tuple[int, float]]:
    """`size:ms,...` as (size, seconds), sorted by size."""
    points = []
    for item in text.split(","):
        size, _, ms = item.partition(":")
        points.append((int(size), float(ms) / 1000))
    if not points or any(size < 1 or seconds < 0 for size, seconds in points):
        raise ValueError(f"a batch table is size:ms,... with sizes >= 1, not {text!r}")
    return sorted(points)


def table_seconds(table: Sequence[tuple[int, float]], size: int) -> float:
    """A batch of `size`'s time by `table`: linear between its sizes; beyond its ends, the
    end's time per row."""
    if size <= table[0][0]:
        return table[0][1] * size / table[0][0]
    for (low, low_s), (high, high_s) in itertools.pairwise(table):
        if size <= high:
            return low_s + (high_s - low_s) * (size - low) / (high - low)
    return table[-1][1] * size / table[-1][0]


class TimedRecognizer:
    """Transcribes an utterance as `n=<sample count>` after a simulated model time."""

    def __init__(
        self,
        batch_s: float,
        utterance_s: float,
        max_batch_size: int,
        table: Sequence[tuple[int, float]] = (),
    ) -> None:
        self._batch_s = batch_s
        self._utterance_s = utterance_s
        self._max_batch_size = max_batch_size
        self._table = list(table)

    @property
    def name(self) -> str:
        return "fake"

    @property
    def max_batch_size(self) -> int:
        return self._max_batch_size

    @property
    def languages(self) -> frozenset[str]:
        return frozenset({"en"})

    def warmup(self) -> None:
        return None

    def seconds(self, size: int) -> float:
        if self._table:
            return table_seconds(self._table, size)
        return self._batch_s + self._utterance_s * size

    def transcribe(
        self, batch: Sequence[Utterance], should_stop: Callable[[], bool] | None = None
    ) -> list[Transcription]:
        end = time.monotonic() + self.seconds(len(batch))
        while (left := end - time.monotonic()) > 0:
            if should_stop is not None and should_stop():
                raise Interrupted
            time.sleep(min(STEP, left))
        return [
            Transcription(
                text=f"n={len(u.audio)}",
                language="en",
                avg_logprob=-0.1,
                no_speech_prob=0.0,
                language_probability=None,
            )
            for u in batch
        ]


def timed_recognizer(settings: Settings) -> TimedRecognizer:
    table = os.environ.get("PARLEY_FAKE_BATCH_TABLE")
    return TimedRecognizer(
        float(os.environ.get("PARLEY_FAKE_BATCH_MS", "30")) / 1000,
        float(os.environ.get("PARLEY_FAKE_UTTERANCE_MS", "10")) / 1000,
        settings.scheduler.max_batch_size,
        batch_table(table) if table else (),
    )


if __name__ == "__main__":
    sys.exit(main(recognizer=timed_recognizer))
