"""RedisStore only: several processes on one Redis, key layout, and Redis faults (a
redis-server of the test's own, killed and restarted on the same port)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from store.errors import StoreOverloaded, StoreUnavailable, SubscriberLagged, SubscriptionLost
from store.factory import open_store
from store.records import FinalRecord, SourceState, hash_token
from store.redis.store import RedisStore
from tests.store.test_store import emit, next_event
from tests.support.redis_support import ManualClock, RedisServer, free_port
from tests.support.timeouts import MS


@pytest.fixture
async def two_nodes(
    redis_url: str, redis_prefix: str, clock: ManualClock
) -> AsyncIterator[tuple[RedisStore, RedisStore]]:
    """Two stores with their own connections on one Redis: two server processes."""
    a = RedisStore.from_url(redis_url, prefix=redis_prefix, clock=clock)
    b = RedisStore.from_url(redis_url, prefix=redis_prefix, clock=clock)
    yield a, b
    await a.close()
    await b.close()


@pytest.fixture
async def own_redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    """A persistent (AOF, fsync always) redis-server that the test may kill and restart."""
    server = RedisServer(tmp_path, persistent=True)
    server.start()
    yield server
    server.stop()


def log_is_clean(log: list[FinalRecord]) -> bool:
    """Gap-free from 1, no utterance twice."""
    return [r.seq for r in log] == list(range(1, len(log) + 1)) and len(
        {r.utterance_id for r in log}
    ) == len(log)


async def test_open_store_picks_the_backend(redis_url: str, redis_prefix: str) -> None:
    """No URL gives the MemoryStore; a URL gives a RedisStore under the prefix."""
    memory = open_store(None)
    assert (await memory.health()).backend == "memory"
    redis = open_store(redis_url, prefix=redis_prefix)
    assert isinstance(redis, RedisStore)
    assert (await redis.health()).ok
    await redis.close()
    await memory.close()


async def test_key_layout(redis_url: str, redis_prefix: str) -> None:
    """A meeting is three keys under the prefix, plus one token hint per source."""
    store = RedisStore.from_url(redis_url, prefix=redis_prefix)
    client = Redis.from_url(redis_url)
    try:
        state, token = await store.create_source("m1", "alice")
        await emit(store, state)
        found = {k.decode() async for k in client.scan_iter(match=redis_prefix + "*")}
    finally:
        await client.aclose()
        await store.close()
    assert found == {
        redis_prefix + name + (hash_token(token) if name == "token:" else "")
        for name in ("meeting:m1:meta", "meeting:m1:log", "meeting:m1:src", "token:")
    }


async def test_two_nodes_share_log_events_and_resume(
    two_nodes: tuple[RedisStore, RedisStore],
) -> None:
    """A source started on one node resumes on the other; both append gap-free to one log;
    a listener on one node sees events published on the other; either serves the log."""
    a, b = two_nodes
    alice, token = await a.create_source("m1", "alice")
    bob, _ = await b.create_source("m1", "bob")
    async with b.subscribe("m1") as events:
        await a.publish("m1", b"from a")
        assert await next_event(events) == b"from a"

    async def actor(store: RedisStore, state: SourceState, n: int) -> SourceState:
        for _ in range(n):
            _, state = await emit(store, state)
        return state

    alice, _ = await asyncio.gather(actor(a, alice, 30), actor(b, bob, 30))
    resumed = await b.resume_source("m1", token, participant="alice")
    assert resumed.acked_until == alice.acked_until
    assert resumed.next_utterance == 30
    assert await a.finals("m1") == await b.finals("m1")
    assert log_is_clean(await a.finals("m1"))
    assert len(await a.finals("m1")) == 60


async def test_redis_restart_mid_meeting(own_redis: RedisServer, clock: ManualClock) -> None:
    """Kill Redis mid-meeting: finals keep their seqs (buffered), health is degraded,
    listeners are dropped; restart on the same port: the log catches up in order, without
    gap or duplicate, and health is ok again."""
    store = RedisStore.from_url(
        own_redis.url, clock=clock, read_wait_s=100 * MS, retry_delays=(10 * MS, 100 * MS)
    )
    try:
        state, token = await store.create_source("m1", "alice")
        given: list[FinalRecord] = []
        for _ in range(20):
            record, state = await emit(store, state)
            given.append(record)
        async with store.subscribe("m1") as events:
            own_redis.kill()
            for _ in range(40):  # streaming goes on
                record, state = await emit(store, state)
                given.append(record)
            with pytest.raises(SubscriptionLost):
                await next_event(events)
        assert [r.seq for r in given] == list(range(1, 61))
        health = await store.health()
        assert not health.ok and health.buffered == 40
        assert "unreachable" in health.reason
        with pytest.raises(StoreUnavailable):
            await store.finals("m1")  # waits a little for the buffer, then says why
        with pytest.raises(StoreUnavailable):
            await store.create_source("a-new-meeting", "bob")  # this node never served it
        bob, _ = await store.create_source("m1", "bob")  # a meeting it serves: buffered
        record, bob = await emit(store, bob)
        given.append(record)

        own_redis.start()
        assert await store.flushed(5000 * MS)
        assert (await store.health()).ok
        log = await store.finals("m1")
        assert log == given
        assert log_is_clean(log)
        assert store.resequenced == 0
        resumed = await store.resume_source("m1", token)
        assert resumed.acked_until == state.acked_until
        record, _ = await emit(store, resumed)
        assert record.seq == 62
    finally:
        await store.close()


async def test_full_buffer_refuses_rather_than_loses(own_redis: RedisServer) -> None:
    """With the buffer full, appends raise StoreOverloaded (nothing silently lost) and new
    sessions are refused from half-full on; health names the reason."""
    store = RedisStore.from_url(own_redis.url, buffer_limit=6, retry_delays=(10 * MS, 50 * MS))
    try:
        state, _ = await store.create_source("m1", "alice")
        own_redis.kill()
        for _ in range(3):
            _, state = await emit(store, state)
        with pytest.raises(StoreOverloaded, match="not admitting new sessions"):
            await store.create_source("m1", "bob")
        for _ in range(3):
            _, state = await emit(store, state)
        with pytest.raises(StoreOverloaded, match="not logged"):
            await emit(store, state)
        health = await store.health()
        assert not health.ok and "refusing new sessions" in health.reason
        own_redis.start()
        assert await store.flushed(5000 * MS)
        log = await store.finals("m1")
        assert [r.utterance_id for r in log] == [f"{state.session_id}-{i}" for i in range(6)]
        _, state = await emit(store, state)  # the refused final, sent again, takes seq 7
        assert [r.seq for r in await store.finals("m1")] == list(range(1, 8))
    finally:
        await store.close()


async def test_restart_that_lost_data_keeps_the_seqs_given(tmp_path: Path) -> None:
    """If Redis comes back empty (no persistence), buffered finals keep the seqs clients
    were given: the log shows the loss as a gap instead of reusing seqs."""
    server = RedisServer(tmp_path, persistent=False)
    server.start()
    store = RedisStore.from_url(server.url, retry_delays=(10 * MS, 50 * MS))
    try:
        state, _ = await store.create_source("m1", "alice")
        for _ in range(5):
            _, state = await emit(store, state)
        server.kill()
        for _ in range(3):
            _, state = await emit(store, state)
        server.start()
        assert await store.flushed(5000 * MS)
        assert [r.seq for r in await store.finals("m1")] == [6, 7, 8]
        assert (await emit(store, state))[0].seq == 9
    finally:
        await store.close()
        server.stop()


async def test_degraded_node_resequences_after_another_node(
    two_nodes: tuple[RedisStore, RedisStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The documented trade-off: node A cut off from Redis gives provisional seqs while
    node B keeps writing the same meeting; A's replay logs its finals after B's (seqs
    change, counted in `resequenced`), and the log stays gap-free and duplicate-free."""
    a, b = two_nodes
    alice, _ = await a.create_source("m1", "alice")
    bob, _ = await b.create_source("m1", "bob")
    _, alice = await emit(a, alice)
    _, bob = await emit(b, bob)

    real_append = a._append
    cut_off = True

    async def partitioned(*args: Any, **kwargs: Any) -> Any:
        if cut_off:
            raise RedisConnectionError("partitioned (test)")
        return await real_append(*args, **kwargs)

    monkeypatch.setattr(a, "_append", partitioned)
    provisional = []
    for _ in range(3):
        record, alice = await emit(a, alice)
        provisional.append(record.seq)
    assert provisional == [2, 3, 4]  # from the last seq A knows: its own 1
    for _ in range(2):
        _, bob = await emit(b, bob)  # B takes 3 and 4
    cut_off = False
    assert await a.flushed(5000 * MS)
    log = await a.finals("m1")
    assert log_is_clean(log) and len(log) == 7
    assert [r.seq for r in log if r.participant == "alice"] == [1, 5, 6, 7]
    assert a.resequenced == 3


async def test_listener_dropped_when_slow_across_nodes(
    two_nodes: tuple[RedisStore, RedisStore],
) -> None:
    """A listener that never reads does not hold up the shared subscription connection."""
    a, b = two_nodes
    async with b.subscribe("m1") as slow, b.subscribe("m1") as fast:
        for i in range(300):
            await a.publish("m1", b"%d" % i)
            assert await next_event(fast) == b"%d" % i
        with pytest.raises(SubscriberLagged):
            await next_event(slow)


async def test_unsubscribed_channel_is_released(redis_url: str, redis_prefix: str) -> None:
    """When the last listener of a meeting leaves, the node unsubscribes from its channel."""
    store = RedisStore.from_url(redis_url, prefix=redis_prefix)
    client = Redis.from_url(redis_url)
    try:
        channel = f"{redis_prefix}meeting:m1:events"
        async with store.subscribe("m1"):
            assert (await client.pubsub_numsub(channel))[0][1] == 1
        deadline = time.monotonic() + 10_000 * MS  # the unsubscribe runs as a task: poll
        while time.monotonic() < deadline:
            if (await client.pubsub_numsub(channel))[0][1] == 0:
                break
            await asyncio.sleep(10 * MS)
        assert (await client.pubsub_numsub(channel))[0][1] == 0
    finally:
        await client.aclose()
        await store.close()


async def test_unreachable_at_start_is_reported(clock: ManualClock) -> None:
    """With no Redis at all: health degraded with the reason, new sessions unavailable."""
    store = RedisStore.from_url(f"redis://127.0.0.1:{free_port()}/0", clock=clock)
    try:
        health = await store.health()
        assert not health.ok and "unreachable" in health.reason
        with pytest.raises(StoreUnavailable):
            await store.create_source("m1", "alice")
        with pytest.raises(StoreUnavailable):
            await store.finals("m1")
        with pytest.raises(StoreUnavailable):
            async with store.subscribe("m1"):
                pass
        await store.publish("m1", b"dropped, not raised")
    finally:
        await store.close()


async def test_meeting_id_reused_after_expiry_starts_at_seq_1(
    redis_url: str, redis_prefix: str
) -> None:
    """A node that served a meeting which then expired numbers a new one of that id from 1."""
    store = RedisStore.from_url(redis_url, prefix=redis_prefix)
    client = Redis.from_url(redis_url)
    try:
        state, _ = await store.create_source("m1", "alice")
        for _ in range(3):
            _, state = await emit(store, state)
        await client.delete(*[k async for k in client.scan_iter(match=redis_prefix + "*")])
        state, _ = await store.create_source("m1", "bob")
        assert (await emit(store, state))[0].seq == 1
    finally:
        await client.aclose()
        await store.close()


async def test_broken_subscription_drops_listeners_even_if_redis_is_up(
    own_redis: RedisServer,
) -> None:
    """The server closes the pub/sub connection but stays up: listeners are told
    (SubscriptionLost) instead of silently missing what was published meanwhile."""
    store = RedisStore.from_url(own_redis.url)
    client = Redis.from_url(own_redis.url)
    try:
        async with store.subscribe("m1") as events:
            await store.publish("m1", b"before")
            assert await next_event(events) == b"before"
            assert await client.client_kill_filter(_type="pubsub") == 1
            with pytest.raises(SubscriptionLost):
                await next_event(events)
        async with store.subscribe("m1") as events:  # a new subscription works
            await store.publish("m1", b"after")
            assert await next_event(events) == b"after"
    finally:
        await client.aclose()
        await store.close()


async def test_cancelled_append_blocks_provisional_seqs_until_redis_answers(
    redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append cancelled after Redis logged it leaves this node unsure of the last seq:
    it refuses to buffer that meeting (StoreUnavailable, the session resumes later) rather
    than hand out a seq that may be taken, until Redis tells it the seq again."""
    store = RedisStore.from_url(redis_url, prefix=redis_prefix)
    try:
        state, _ = await store.create_source("m1", "alice")
        _, state = await emit(store, state)
        real_append = store._append
        mode = "apply-then-hang"
        applied = asyncio.Event()

        async def faulty(*args: Any, **kwargs: Any) -> Any:
            if mode == "down":
                raise RedisConnectionError("down (test)")
            result = await real_append(*args, **kwargs)
            if mode == "apply-then-hang":
                applied.set()  # Redis logged it ...
                await asyncio.Event().wait()  # ... but the reply never comes back in time
            return result

        monkeypatch.setattr(store, "_append", faulty)
        task = asyncio.create_task(emit(store, state))
        await asyncio.wait_for(applied.wait(), 10_000 * MS)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        mode = "down"
        with pytest.raises(StoreUnavailable, match="not known for sure"):
            await emit(store, state)
        mode = "up"
        assert await store.last_seq("m1") == 2  # Redis answers: the doubt is settled
        record, state = await emit(store, state)  # the resumed session redoes that utterance
        assert record.seq == 2  # ... which is already logged: same seq, nothing added
        record, _ = await emit(store, state)
        assert record.seq == 3
        assert log_is_clean(await store.finals("m1"))
    finally:
        await store.close()


async def test_records_written_before_origins_still_read(
    redis_url: str, redis_prefix: str, clock: ManualClock
) -> None:
    """Source state and finals logged by older code (no `origin`) read as origin None;
    a resumed old source gets the guess `now - acked_until`, stored with its next final."""
    store = RedisStore.from_url(redis_url, prefix=redis_prefix, clock=clock)
    redis = Redis.from_url(redis_url)
    try:
        state, token = await store.create_source("m1", "alice")
        src = f"{redis_prefix}meeting:m1:src"
        old_state = {"participant": "alice", "acked_until": 4.0, "next_utterance": 1,
                     "context": "hi", "language": "en"}  # fmt: skip
        await redis.hset(src, f"s:{state.session_id}", orjson.dumps(old_state))
        old_final = {"utterance_id": f"{state.session_id}-0", "session_id": state.session_id,
                     "participant": "alice", "text": "hi", "start": 1.0, "end": 4.0,
                     "language": "en", "words": [], "speaker": None}  # fmt: skip
        await redis.xadd(f"{redis_prefix}meeting:m1:log", {"f": orjson.dumps(old_final)}, id="1-0")
        [logged] = await store.finals("m1")
        assert (logged.text, logged.origin) == ("hi", None)
        resumed = await store.resume_source("m1", token)
        assert (resumed.origin, resumed.acked_until) == (None, 4.0)
        guessed = resumed.with_origin(clock.now)
        assert guessed.origin == round(clock.now - 4.0, 3)
        record, _ = await emit(store, guessed)
        assert (record.seq, record.origin) == (2, guessed.origin)
        assert (await store.resume_source("m1", token)).origin == guessed.origin
    finally:
        await redis.aclose()
        await store.close()


async def test_the_pool_is_capped_and_calls_beyond_it_wait(
    redis_url: str, redis_prefix: str
) -> None:
    """40 sources created and written at once through a store capped at 2 connections:
    every call succeeds, and Redis sees 2 connections of that store, not 40."""
    name = "cap-" + redis_prefix.strip(":").replace(":", "-")
    store = RedisStore.from_url(
        redis_url, prefix=redis_prefix, max_connections=2, client_name=name, socket_timeout=5.0
    )
    client = Redis.from_url(redis_url)
    try:
        states = await asyncio.gather(*(store.create_source(f"m{i}", "alice") for i in range(40)))
        await asyncio.gather(*(emit(store, state) for state, _ in states))
        clients = await client.client_list()
    finally:
        await client.aclose()
        await store.close()
    assert len(states) == 40
    assert sum(1 for c in clients if c["name"] == name) == 2
