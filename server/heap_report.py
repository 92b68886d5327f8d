"""The Python heap's allocation sites on demand, for finding what grows in a long run.

Off unless Python's own tracemalloc is on (`PYTHONTRACEMALLOC=1`, which `bench.soak`
sets): then each SIGUSR1 logs one `heap report` line with the largest allocation sites
(`top`) and the sites that grew most since the previous report (`grew`), by file and
line, then what a full garbage collection frees (`garbage_mib`: cycles the collector had not
reached yet; `gc`: its runs and finds per generation since the start). Taking the snapshot
stops the event loop for as long as it takes, which grows with the traced heap: seconds on a
busy server's heap, long enough for every stream to hit its idle limit and its client's
pings to time out (docs/operations.md#heap-reports). A diagnostic for an incident or a
run of its own, never the run whose latency or losses you report.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import tracemalloc
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

    def report(self) -> None:
        snapshot = tracemalloc.take_snapshot().filter_traces(
            (tracemalloc.Filter(False, tracemalloc.__file__),)
        )
        top = snapshot.statistics("lineno")
        grew = snapshot.compare_to(self._last, "lineno") if self._last is not None else []
        grew.sort(key=lambda s: s.size_diff, reverse=True)
        self._last = snapshot
        traced, peak = tracemalloc.get_traced_memory()
        gc.collect()
        collected, _ = tracemalloc.get_traced_memory()
        logger.info(
            "heap report",
            extra={
                "traced_mib": round(traced / 2**20, 2),
                "peak_mib": round(peak / 2**20, 2),
                "garbage_mib": round((traced - collected) / 2**20, 2),
                "gc": gc.get_stats(),
                "top": _sites(top),
                "grew": _sites(grew),
            },
        )


def install_heap_reports() -> bool:
    """Answer SIGUSR1 with a heap report when tracemalloc traces; whether it was installed."""
    if not tracemalloc.is_tracing():
        return False
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, HeapReporter().report)
    logger.info("tracemalloc is on: SIGUSR1 logs a heap report")
    return True


def remove_heap_reports() -> None:
    """Undo `install_heap_reports` (at shutdown; nothing when it was not installed)."""
    if tracemalloc.is_tracing():
        asyncio.get_running_loop().remove_signal_handler(signal.SIGUSR1)
