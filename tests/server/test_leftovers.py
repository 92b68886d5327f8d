"""No per-meeting state outlives its meetings: after rounds of streams and listeners end,
the server's and the Redis store's maps are empty and the event loop runs no more tasks
than after the first round (whose one-off warm-up, the subscription reader, stays).
bench/soak watches the same over hours; this catches a leak in seconds."""

from __future__ import annotations

import asyncio

from server.state import AppState
from store.redis.store import RedisStore
from tests.support.appserver import AppServer, serve_app
from tests.support.corpus import clip
from tests.support.hardclient import STOP, exchange

MEETINGS_PER_ROUND = 3


async def _round(server: AppServer, index: int, frames: list[bytes | str]) -> None:
    """Each meeting: one stream of the clip and one listener that stays a little after."""
    meetings = [f"leftover-{index}-{k}" for k in range(MEETINGS_PER_ROUND)]
    url = server.ws_url + "/v1/meetings/{}/"
    streams = [exchange(url.format(m) + "stream?participant=p", frames) for m in meetings]
    listeners = [
        exchange(url.format(m) + "events", until=lambda r: bool(r.finals), linger=1.0)
        for m in meetings
    ]
    results = await asyncio.gather(*streams, *listeners)
    for result in results[:MEETINGS_PER_ROUND]:
        assert result.close_code == 1000 and result.finals
    for result in results[MEETINGS_PER_ROUND:]:
        assert result.finals  # the listener heard the meeting live


def _held(state: AppState) -> list[str]:
    """What per-meeting state the server and the Redis store still hold."""
    store = state.store
    assert isinstance(store, RedisStore)
    maps = {
        "registry": len(state.registry),
        "quota leases": bool(store.quotas),
        "listener slots (total)": state.listener_slots.total.in_use,
        **{f"store {name}": count for name, count in store.held().items()},
    }
    return [name for name, held in maps.items() if held]


async def _settled(state: AppState, tasks_at_most: int | None = None) -> int:
    """Wait (10 s at most) until the last session is released and the store's unsubscribes,
    spawned as the listeners left, are done (and, given `tasks_at_most`, until no more tasks
    run than that); the tasks then alive. However long that takes on a loaded machine."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while loop.time() < deadline:
        if not _held(state) and (
            tasks_at_most is None or len(asyncio.all_tasks()) <= tasks_at_most
        ):
            break
        await asyncio.sleep(0.05)
    return len(asyncio.all_tasks())


def _assert_nothing_per_meeting(state: AppState) -> None:
    assert _held(state) == []


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
            assert await _settled(server.state, tasks_after_first) <= tasks_after_first
            _assert_nothing_per_meeting(server.state)
