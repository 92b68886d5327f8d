"""Cancelling a task for sure.

On Python 3.11 `asyncio.wait_for` returns the inner result and drops the cancellation when
a cancel lands in the same turn as its inner future completes (CPython gh-86296, fixed in
3.12). redis-py wraps each command's write in `wait_for`, so a task cancelled while it
talks to Redis may run on as if nothing happened: a listener's forwarder did, then waited
for the meeting's events for ever (bench/fuzz_sessions.py with `--store redis`).
`cancel_and_wait` cancels again until the task has ended."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

RECANCEL_S = 0.05  # how long a cancelled task has to end before it is cancelled again


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel each task, and again while it runs on; return once all have ended. Their
    results and exceptions are left for the caller (retrieved, so none is logged)."""
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_S)
