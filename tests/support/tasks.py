"""Synchronising a test with a task on the event loop's steps, not on time."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def blocked(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """`coro` in a task that has run up to its first wait (or to its end)."""
    entered = asyncio.Event()

    async def run() -> T:
        entered.set()
        return await coro

    task = asyncio.create_task(run())
    await entered.wait()  # the task's first step, up to where it waits, is done by now
    return task
