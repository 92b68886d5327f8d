"""`server.memory_trim`: freed heap pages the allocator kept go back to the OS."""

from __future__ import annotations

import asyncio
import sys

import numpy as np
import pytest

from engine.memory import malloc_trim
from server.memory_trim import trim_memory_forever

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")


def rss_anon_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no RssAnon in /proc/self/status")


def test_trim_returns_what_the_heap_kept_after_the_mmap_threshold_rose() -> None:
    """The server's case: a large buffer freed raises glibc's mmap threshold, the next
    buffers of 1 MiB come from the heap, and once freed (the last one still live, so the
    heap cannot shrink from its top) their pages stay in the RSS until `malloc_trim`."""
    trim = malloc_trim()
    assert trim is not None
    big = np.ones(8 << 20, np.uint8)  # 8 MiB, mmapped; freeing it raises the threshold
    del big
    buffers = [np.ones(1 << 20, np.uint8) for _ in range(200)]  # 200 MiB from the heap
    last = buffers.pop()
    buffers.clear()
    kept = rss_anon_mib()
    trim()
    released = kept - rss_anon_mib()
    assert last[0] == 1
    assert released > 100, f"malloc_trim gave back only {released:.1f} MiB"


async def test_the_trimmer_runs_until_cancelled() -> None:
    task = asyncio.create_task(trim_memory_forever(0.01))
    await asyncio.sleep(0.1)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
