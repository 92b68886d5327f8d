"""The Python heap's allocation sites on demand, for finding what grows in a long run.

Off unless Python's own tracemalloc is on (`PYTHONTRACEMALLOC=1`, which `bench.soak`
sets): then each SIGUSR1 logs one `heap report` line with the largest allocation sites
(`top`) and the sites that grew most since the previous report (`grew`), by file and
line, then what a full garbage collection frees (`garbage_mib`: cycles the collector had not
reached yet; `gc`: its runs and finds per generation since the start) and the types with
the most objects the collector tracks (`types`) and that gained most (`types_grew`).
Taking the snapshot stops the event loop while tracemalloc copies its traces (longer the
more is traced); the sorting into sites (~95 % of the time: 4 s of 70 s for 834k traces)
runs in a thread, where the loop gets its turns. A soak's server with 245 MiB traced
stopped for 31 s when the sorting ran on the loop: every stream hit its idle limit
(docs/operations.md#heap-reports). Tracing slows every allocation: a diagnostic for an
incident or a run of its own, never the run whose latency or losses you report.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import tracemalloc
from collections import Counter
from typing import Any

logger = logging.getLogger("parley.heap")

TOP_SITES = 15


def _sites(stats: list[tracemalloc.StatisticDiff] | list[tracemalloc.Statistic]) -> list[Any]:
    rows = []
    for stat in stats[:TOP_SITES]:
        frame = stat.traceback[0]
        row = {"site": f"{frame.filename}:{frame.lineno}", "kib": round(stat.size / 1024, 1)}
        if isinstance(stat, tracemalloc.StatisticDiff):
            row["grew_kib"] = round(stat.size_diff / 1024, 1)
        rows.append(row)
    return rows


class HeapReporter:
    """Logs a `heap report` per SIGUSR1 while tracemalloc traces; holds the last snapshot."""

    def __init__(self) -> None:
        self._last: tracemalloc.Snapshot | None = None
        self._last_types: Counter[str] = Counter()
        self._running: asyncio.Task[None] | None = None

    def request(self) -> None:
        """SIGUSR1's handler: take the snapshot here (tracemalloc copies its traces holding
        the GIL, wherever it runs) and sort it into sites in a thread, where the event
        loop gets its turns between the interpreter's switches; one report at a time."""
        if self._running is not None and not self._running.done():
            logger.info("a heap report is still being made: this signal is ignored")
            return
        snapshot = tracemalloc.take_snapshot()
        self._running = asyncio.get_running_loop().create_task(self._report_in_thread(snapshot))

    async def _report_in_thread(self, snapshot: tracemalloc.Snapshot) -> None:
        try:
            await asyncio.to_thread(self.report, snapshot)
        except Exception:  # a diagnostic: never let it take anything else down
            logger.exception("heap report failed")

    def report(self, snapshot: tracemalloc.Snapshot | None = None) -> None:
        """Log the report of `snapshot` (None: one taken now) against the last one."""
        snapshot = tracemalloc.take_snapshot() if snapshot is None else snapshot
        traced, peak = tracemalloc.get_traced_memory()
        gc.collect()
        collected, _ = tracemalloc.get_traced_memory()
        # Counted before the sorting below makes its own objects.
        types = Counter(type(o).__qualname__ for o in gc.get_objects())
        more = types.copy()
        more.subtract(self._last_types)
        self._last_types = types
        snapshot = snapshot.filter_traces((tracemalloc.Filter(False, tracemalloc.__file__),))
        top = snapshot.statistics("lineno")
        grew = snapshot.compare_to(self._last, "lineno") if self._last is not None else []
        grew.sort(key=lambda s: s.size_diff, reverse=True)
        self._last = snapshot
        logger.info(
            "heap report",
            extra={
                "traced_mib": round(traced / 2**20, 2),
                "peak_mib": round(peak / 2**20, 2),
                "garbage_mib": round((traced - collected) / 2**20, 2),
                "gc": gc.get_stats(),
                "top": _sites(top),
                "grew": _sites(grew),
                "types": types.most_common(TOP_SITES),
                "types_grew": [t for t in more.most_common(TOP_SITES) if t[1] > 0],
            },
        )


def install_heap_reports() -> bool:
    """Answer SIGUSR1 with a heap report when tracemalloc traces; whether it was installed."""
    if not tracemalloc.is_tracing():
        return False
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, HeapReporter().request)
    logger.info("tracemalloc is on: SIGUSR1 logs a heap report")
    return True


def remove_heap_reports() -> None:
    """Undo `install_heap_reports` (at shutdown; nothing when it was not installed)."""
    if tracemalloc.is_tracing():
        asyncio.get_running_loop().remove_signal_handler(signal.SIGUSR1)
