"""glibc's `malloc_trim(0)`: give the heap's free pages back to the OS; and what the heap
holds (`heap_usage`), for telling a leak from memory the allocator keeps.

The model's activations are large, short-lived buffers that glibc keeps once freed, so a
process that runs the model holds the high-water mark of its busiest moment unless it
trims now and then (server/memory_trim.py has the measurements). The server's process
trims on a timer; a model worker process (`engine.workers.processes`) trims between
batches.
"""

from __future__ import annotations

import ctypes
import ctypes.util
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
