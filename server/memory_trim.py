"""Give freed heap memory back to the OS now and then (glibc `malloc_trim`).

The model's activations are large, short-lived buffers of many sizes (an encoder pass
on a 10 s window allocates attention scores of ~6 MB; a decoder step a few hundred KB of
logits). glibc serves them from its arenas once its dynamic mmap threshold has risen
past their size, and keeps the freed pages: a server's RSS climbs for minutes in steps
and then stays at the high-water mark of its busiest moment, although nothing is live.
On the corpus through the file path (docs/performance.md, "Long runs"), the RSS rose from
~870 to 1,018 MiB in five passes and stayed there; with a `malloc_trim(0)` after each
pass it stayed at ~757 MiB, and with a fixed mmap threshold of 128 KiB at ~740 MiB but
each pass took ~30 % longer (every large buffer mmapped, page-faulted and unmapped).

`trim_memory_forever` calls `malloc_trim(0)` every `interval` seconds in a worker thread
(ctypes releases the GIL for the call; it takes a few milliseconds and never blocks the
event loop). On a C library without `malloc_trim` (musl, macOS) it does nothing. Model
workers that run as processes (`engine.workers.processes`) trim their own heaps, where
the activations live, on the same interval.
"""

from __future__ import annotations

import asyncio
import logging
import time

from engine.memory import malloc_trim

logger = logging.getLogger("parley.memory")


async def trim_memory_forever(interval: float) -> None:
    """Every `interval` seconds give free heap pages back to the OS; until cancelled."""
    trim = malloc_trim()
    if trim is None:
        logger.info("malloc_trim is not available here: freed memory stays with the allocator")
        return
    while True:
        await asyncio.sleep(interval)
        started = time.perf_counter()
        released = await asyncio.to_thread(trim)
        logger.debug(
            "malloc_trim",
            extra={"released": bool(released), "ms": 1000 * (time.perf_counter() - started)},
        )
