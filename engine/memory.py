"""glibc's `malloc_trim(0)`: give the heap's free pages back to the OS; a fixed threshold
above which blocks are mapped apart from the heap (`fix_mmap_threshold`); the startup
objects kept out of the cyclic collector's count (`freeze_startup_objects`); and what the
heap holds (`heap_usage`), for telling a leak from memory the allocator keeps.

The model's activations are large, short-lived buffers that glibc keeps once freed, so a
process that runs the model holds the high-water mark of its busiest moment unless it
trims now and then (server/memory_trim.py has the measurements). The server's process
trims on a timer; a model worker process (`engine.workers.processes`) trims between
batches.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache


@cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def malloc_trim() -> Callable[[], int] | None:
    """glibc's `malloc_trim(0)` as a function, or None where the C library has none."""
    function = getattr(_libc(), "malloc_trim", None)
    if function is None:
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    return lambda: int(function(0))


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


def fix_mmap_threshold(size: int) -> bool:
    """Serve every block of `size` bytes or more with its own mapping, given back to the OS
    when freed (glibc `mallopt(M_MMAP_THRESHOLD)`); False where the C library has none.

    glibc's own threshold starts at 128 KiB and rises to the largest mapped block freed
    (up to 32 MiB), after which large blocks come from the heap. In the server that lets
    asyncio's 256 KiB reads (shrunk to the bytes received) and the utterances' audio
    arrays churn through the main heap between small long-lived objects, and malloc kept
    65-124 MiB free. A fixed threshold keeps those blocks out of the heap: a soak's server
    held ~35 MiB less with it and malloc kept 2-15 MiB free; its slow rise under load was
    not that (docs/performance.md#long-runs-memory). The heap's free top is given back
    past twice `size` (glibc's own ratio, fixed too): a top kept large by an earlier,
    higher threshold would serve large blocks from the heap again."""
    function = getattr(_libc(), "mallopt", None)
    if function is None:
        return False
    function.argtypes = [ctypes.c_int, ctypes.c_int]
    function.restype = ctypes.c_int
    return bool(function(M_MMAP_THRESHOLD, size)) and bool(function(M_TRIM_THRESHOLD, 2 * size))


def freeze_startup_objects() -> int:
    """Collect, move every object alive now (the loaded libraries and models: hundreds of
    thousands) out of the cyclic collector's view (`gc.freeze`), and collect again; returns
    how many were frozen. CPython runs a full collection only when the objects promoted
    since the last one reach a quarter of those that survived it: with the startup objects
    counted, a soak's server went ~100 minutes between full collections, and what its
    sessions left in reference cycles meanwhile (40,000 blocks, 24 MiB of malloc) stayed
    until then (docs/performance.md#long-runs-memory). The second collection sets that
    count to what is not frozen (`gc.freeze` alone keeps the old one), so a full
    collection scans only what came since. It did not make them much more frequent: the
    objects made after the freeze (the first sessions' caches) set the quarter, and the
    2-hour soak's first full collection still came after ~96 minutes."""
    gc.collect()
    gc.freeze()
    gc.collect()
    return gc.get_freeze_count()


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


@dataclass(frozen=True, slots=True)
class HeapUsage:
    """What this process's heaps hold now. A leak grows `malloc_in_use` or
    `python_blocks`; memory the allocator keeps but no one uses grows `malloc_free`."""

    python_blocks: int  # objects and buffers held by Python's own allocator (pymalloc)
    malloc_in_use: int | None  # bytes allocated through malloc (glibc only; None elsewhere)
    malloc_free: int | None  # bytes freed but kept in malloc's arenas (not given back)


@cache
def _mallinfo2() -> Callable[[], _Mallinfo2] | None:
    """glibc's `mallinfo2`, typed once; None where there is none (not glibc, or < 2.33)."""
    function = getattr(_libc(), "mallinfo2", None)
    if function is None:
        return None
    function.argtypes = []
    function.restype = _Mallinfo2
    return function  # type: ignore[no-any-return]


def heap_usage() -> HeapUsage:
    """This process's `HeapUsage` (glibc's `mallinfo2`: walks each arena's free lists,
    well under a millisecond on the server's heap)."""
    mallinfo2 = _mallinfo2()
    if mallinfo2 is None:
        return HeapUsage(sys.getallocatedblocks(), None, None)
    info = mallinfo2()
    return HeapUsage(sys.getallocatedblocks(), info.uordblks + info.hblkhd, info.fordblks)
