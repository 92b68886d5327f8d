"""The heap report a soak asks for with SIGUSR1 (server/heap_report.py)."""

from __future__ import annotations

import asyncio
import logging
import sys
import tracemalloc

import pytest

from server.heap_report import HeapReporter


class Grown:
    pass


def test_a_heap_report_names_the_sites_and_types_that_grew(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tracemalloc.start()
    try:
        reporter = HeapReporter()
        with caplog.at_level(logging.INFO, logger="parley.heap"):
            reporter.report()
            kept, line = [bytearray(4096) for _ in range(256)], sys._getframe().f_lineno
            grown = [Grown() for _ in range(300)]
            reporter.report()
    finally:
        tracemalloc.stop()
    first, second = (r for r in caplog.records if r.getMessage() == "heap report")
    assert first.grew == []  # type: ignore[attr-defined]
    grew = second.grew  # type: ignore[attr-defined]
    assert grew[0]["site"].endswith(f"test_heap_report.py:{line}")  # 1 MiB from one line
    assert grew[0]["grew_kib"] >= 1024
    assert second.top and second.traced_mib >= 1  # type: ignore[attr-defined]
    assert ["Grown", 300] in ([n, c] for n, c in second.types_grew)  # type: ignore[attr-defined]
    assert len(kept) == 256 and len(grown) == 300


async def test_the_event_loop_runs_while_a_report_is_sorted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """SIGUSR1's report sorts its snapshot in a thread: the loop keeps serving (a soak's
    server with 245 MiB traced stopped for 31 s when it was sorted on the loop), and a
    second signal while it runs is ignored."""
    tracemalloc.start()
    try:
        kept = [str(i) for i in range(100_000)]  # many traces: a report of a second or so
        reporter = HeapReporter()
        with caplog.at_level(logging.INFO, logger="parley.heap"):
            reporter.request()
            reporter.request()
            ticks = 0
            while not any(r.getMessage() == "heap report" for r in caplog.records):
                await asyncio.sleep(0.001)
                ticks += 1
                assert ticks < 100_000, "no heap report came"
    finally:
        tracemalloc.stop()
    assert ticks >= 20, f"the loop ran only {ticks} times while the report was made"
    messages = [r.getMessage() for r in caplog.records]
    assert messages.count("heap report") == 1
    assert "a heap report is still being made: this signal is ignored" in messages
    assert len(kept) == 100_000
