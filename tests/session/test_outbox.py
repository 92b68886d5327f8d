"""Outbox: committed messages in order, partials merged, slow consumers detected."""

from __future__ import annotations

import asyncio

import pytest

from session.outbox import Outbox, OutboxState, SlowConsumer


async def test_partials_merge_and_finals_drop_their_partial() -> None:
    """Only the newest unsent partial survives; a final removes its utterance's partial."""
    dropped: list[int] = []
    box = Outbox(10, on_partial_dropped=lambda: dropped.append(1))
    box.put("started")
    box.put_partial("u1", "p1")
    box.put_partial("u1", "p1b")
    box.put("final-u1", utterance_id="u1")
    box.put_partial("u2", "p2")
    box.close()
    out = [m async for m in _drain(box)]
    assert out == ["started", "final-u1", "p2"]
    assert len(dropped) == 2 and box.partials_merged == 2


async def test_committed_messages_overflow_is_a_slow_consumer() -> None:
    """More than `limit` unread committed messages overflow the outbox: the put does not
    fail (a final is still logged and published), later puts are dropped, and
    `overflowed()` raises SlowConsumer for the actor to end the stream."""
    box = Outbox(2)
    watcher = asyncio.create_task(box.overflowed())
    box.put("a")
    box.put("b")
    await asyncio.sleep(0)
    assert not watcher.done()
    box.put("c")
    box.put_partial("u1", "p")
    assert box.state is OutboxState.OVERFLOWED and box.dropped == 1
    with pytest.raises(SlowConsumer):
        await asyncio.wait_for(watcher, 1)
    box.close_with("error")  # the backlog is dropped: a resume replays its finals
    assert [m async for m in _drain(box)] == ["error"]


async def test_closed_outbox_refuses_puts_and_drains() -> None:
    """After close, get() drains what is left then returns None; put() raises."""
    box = Outbox(5)
    box.put("x")
    box.close()
    with pytest.raises(RuntimeError):
        box.put("y")
    assert await box.get() == "x"
    assert await box.get() is None


async def _drain(box: Outbox):  # type: ignore[no-untyped-def]
    while (message := await box.get()) is not None:
        yield message
