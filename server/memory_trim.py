"""Give freed heap memory back to the OS every `interval` seconds (glibc `malloc_trim`).

glibc keeps the pages of the model's large, short-lived buffers, so without it the RSS
stays at its busiest moment's peak (docs/performance.md#long-runs-memory). The call runs
in a thread (a few ms, the GIL released); without `malloc_trim` (musl, macOS) it does
nothing. Worker processes trim their own heaps (`engine.workers.processes`).
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
