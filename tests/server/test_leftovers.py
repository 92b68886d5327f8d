"""No per-meeting state outlives its meetings: after rounds of streams and listeners end,
the server's and the Redis store's maps are empty and the event loop runs no more tasks
than after the first round (whose one-off warm-up, the subscription reader, stays).
bench/soak watches the same over hours; this catches a leak in seconds."""

from __future__ import annotations

import asyncio

from server.state import AppState
from store.redis_store import RedisStore
from tests.appserver import AppServer, serve_app
from tests.corpus import clip
from tests.hardclient import STOP, exchange

MEETINGS_PER_ROUND = 3


async def _round(server: AppServer, index: int, frames: list[bytes | str]) -> None:
    """Each meeting: one stream of the clip and one listener that stays a little after."""
    meetings = [f"leftover-{index}-{k}" for k in range(MEETINGS_PER_ROUND)]
    url = server.ws_url + "/v1/meetings/{}/"
    streams = [exchange(url.format(m) + "stream?participant=p", frames) for m in meetings]
    listeners = [exchange(url.format(m) + "events", linger=1.0) for m in meetings]
    results = await asyncio.gather(*streams, *listeners)
    for result in results[:MEETINGS_PER_ROUND]:
        assert result.close_code == 1000 and result.finals
    for result in results[MEETINGS_PER_ROUND:]:
        assert result.finals  # the listener heard the meeting live


async def _settled(state: AppState) -> int:
    """Wait for the last session to be released; the tasks then alive."""
    async with asyncio.timeout(10):
        while len(state.registry):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)  # the store's unsubscribes, spawned as the listeners left
    return len(asyncio.all_tasks())


def _assert_nothing_per_meeting(state: AppState) -> None:
    assert len(state.registry) == 0
    assert not state.stream_slots._held
    assert not state.listener_slots.meetings._held
    assert not state.listener_slots.tenants._held
    assert not state.listener_slots.total._held
    store = state.store
    assert isinstance(store, RedisStore)
    assert not store._locks._locks
    assert not store._buffer._per_meeting
    assert not store._events._channels
    assert not store._events._confirm
    assert not store._events._tasks


async def test_meetings_leave_no_state_behind(redis_url: str, redis_prefix: str) -> None:
    pcm = clip("en_jfk").pcm16()
    frames: list[bytes | str] = [pcm[o : o + 6400] for o in range(0, len(pcm), 6400)]
    frames.append(STOP)
    async with serve_app(redis_url=redis_url, store_prefix=redis_prefix) as server:
        await _round(server, 0, frames)
        tasks_after_first = await _settled(server.state)
        _assert_nothing_per_meeting(server.state)
        for index in (1, 2):
            await _round(server, index, frames)
            assert await _settled(server.state) <= tasks_after_first
            _assert_nothing_per_meeting(server.state)
