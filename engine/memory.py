"""glibc's `malloc_trim(0)`: give the heap's free pages back to the OS.

The model's activations are large, short-lived buffers that glibc keeps once freed, so a
process that runs the model holds the high-water mark of its busiest moment unless it
trims now and then (server/memory_trim.py has the measurements). The server's process
trims on a timer; a model worker process (`engine.workers.processes`) trims between
batches.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable


def malloc_trim() -> Callable[[], int] | None:
    """glibc's `malloc_trim(0)` as a function, or None where the C library has none."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        function = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    return lambda: int(function(0))
