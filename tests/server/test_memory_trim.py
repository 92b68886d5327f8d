"""`server.memory_trim`: freed heap pages the allocator kept go back to the OS; and
`engine.memory.heap_usage`, which tells what the heap holds from what it keeps."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import numpy as np
import pytest

from engine.memory import heap_usage, malloc_trim
from server.memory_trim import trim_memory_forever
from server.metrics import Metrics

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


def test_heap_usage_tells_in_use_from_kept_free() -> None:
    """The soak's attribution (`bench.soak`'s `server_heap`): buffers held count as in use;
    freed, no longer; Python objects as allocated blocks."""
    before = heap_usage()
    assert before.malloc_in_use is not None and before.malloc_free is not None
    buffers = [np.ones(1 << 20, np.uint8) for _ in range(64)]  # 64 MiB from the heap
    objects = [object() for _ in range(10_000)]
    held = heap_usage()
    assert held.malloc_in_use is not None
    assert held.malloc_in_use - before.malloc_in_use >= 60 << 20
    assert held.python_blocks - before.python_blocks >= 10_000
    buffers.clear()
    freed = heap_usage()
    assert freed.malloc_in_use is not None
    assert held.malloc_in_use - freed.malloc_in_use >= 60 << 20
    assert len(objects) == 10_000


def test_metrics_show_the_heaps() -> None:
    body = Metrics().render().decode()
    assert "parley_python_allocated_blocks " in body
    assert 'parley_malloc_bytes{kind="in_use"} ' in body
    assert 'parley_malloc_bytes{kind="free"} ' in body


# A child's heap under the server's pattern: a large block freed (glibc's threshold rises
# to it), then 100 MiB of 256 KiB buffers (asyncio's reads, audio arrays), each followed
# by a small block that lives on (a frame, a dict), then the buffers freed: what went back
# to the OS without a trim.
CHURN = """
import os, sys
from bench.processes import status_kb
from engine.memory import fix_mmap_threshold
def anon_mib():
    return status_kb(os.getpid(), "RssAnon:") / 1024
if sys.argv[1] == "fixed":
    assert fix_mmap_threshold(128 << 10)
big = bytearray(8 << 20)
del big
buffers, small = [], []
for _ in range(400):
    buffers.append(bytearray(256 << 10))
    small.append(bytearray(600))
held = anon_mib()
buffers.clear()
print(held - anon_mib())
"""


@pytest.mark.parametrize("threshold", ["dynamic", "fixed"])
def test_a_fixed_mmap_threshold_gives_large_blocks_back_when_freed(threshold: str) -> None:
    """glibc's own threshold serves the buffers from the heap, where the small blocks
    between them keep their pages; a fixed one maps each apart and unmaps it when freed
    (`PARLEY_MALLOC_MMAP_THRESHOLD_KB`, the server's default 128)."""
    run = subprocess.run(
        [sys.executable, "-c", CHURN, threshold], capture_output=True, text=True, check=True
    )
    released = float(run.stdout)
    if threshold == "fixed":
        assert released > 90, f"a fixed threshold gave back only {released:.1f} MiB"
    else:  # the case the setting exists for: the freed buffers stay in the RSS
        assert released < 20, f"glibc's own threshold gave back {released:.1f} MiB"


# A child with 1,000,000 objects from its start (the server's libraries and models: ~0.5 M),
# then 200,000 more that come and stay (sessions' state): how many full collections ran.
FULL_COLLECTIONS = """
import gc, sys
from engine.memory import freeze_startup_objects
startup = [[i] for i in range(1_000_000)]
gc.collect()
if sys.argv[1] == "frozen":
    assert freeze_startup_objects() >= 1_000_000
full = []
def note(phase, info):
    if phase == "start" and info["generation"] == 2:
        full.append(info)
gc.callbacks.append(note)
sessions = [[i] for i in range(200_000)]
print(len(full))
"""


@pytest.mark.parametrize("startup", ["counted", "frozen"])
def test_full_collections_come_with_the_startup_objects_frozen(startup: str) -> None:
    """Counted, 1,000,000 startup objects put the next full collection 250,000 promotions
    away: 200,000 new objects see none (a session's reference cycles wait for it); frozen
    (`freeze_startup_objects`, as the server does when its model is ready), they see
    some."""
    command = [sys.executable, "-c", FULL_COLLECTIONS, startup]
    full = int(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    assert (full > 0) if startup == "frozen" else (full == 0), f"{full} full collections"
