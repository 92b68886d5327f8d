"""The heap report a soak asks for with SIGUSR1 (server/heap_report.py)."""

from __future__ import annotations

import logging
import tracemalloc

import pytest

from server.heap_report import HeapReporter


def test_a_heap_report_names_the_sites_that_grew(caplog: pytest.LogCaptureFixture) -> None:
    tracemalloc.start()
    try:
        reporter = HeapReporter()
        with caplog.at_level(logging.INFO, logger="parley.heap"):
            reporter.report()
            kept = [bytearray(4096) for _ in range(256)]  # 1 MiB from one line
            reporter.report()
    finally:
        tracemalloc.stop()
    first, second = (r for r in caplog.records if r.getMessage() == "heap report")
    assert first.grew == []  # type: ignore[attr-defined]
    grew = second.grew  # type: ignore[attr-defined]
    assert grew[0]["site"].endswith("test_heap_report.py:19")
    assert grew[0]["grew_kib"] >= 1024
    assert second.top and second.traced_mib >= 1  # type: ignore[attr-defined]
    assert len(kept) == 256
