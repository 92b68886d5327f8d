"""What nodes share through the store: quota slots as leases, upload job records, and
takeover announcements. Each backend on its own (node-local semantics in process); two
RedisStores on one prefix stand for two nodes, and a node whose heartbeat stops stands
for one that died."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import redis.asyncio

from server.registry import SessionRegistry
from server.sockets.takeovers import watch_takeovers
from store.api import QuotaClaim, Store
from store.errors import QuotaFull
from store.redis.store import RedisStore
from tests.conftest import StoreFactory
from tests.support.timeouts import S

STREAMS = QuotaClaim("streams", "tenant-a", 2)
LEASE_S = 0.3  # short, so a "dead" node's leases expire within the test
SETTLE_S = 10 * S  # how long a test waits for a lease to expire at most, on a loaded box


async def test_quota_slots_up_to_the_limit_then_full(store: Store) -> None:
    """Two slots taken, the third refused naming its claim, a released one taken again."""
    first = await store.quotas.acquire([STREAMS])
    await store.quotas.acquire([STREAMS])
    with pytest.raises(QuotaFull) as refused:
        await store.quotas.acquire([STREAMS])
    assert (refused.value.name, refused.value.key) == (STREAMS.name, STREAMS.key)
    assert store.quotas.held("streams", "tenant-a") == 2
    await store.quotas.release(first)
    await store.quotas.acquire([STREAMS])
    assert store.quotas.held("streams", "tenant-a") == 2


async def test_claims_are_taken_all_or_none(store: Store) -> None:
    """A full second claim leaves the first untaken, and is the one named."""
    meeting = QuotaClaim("listeners-meeting", "m1", 1)
    tenant = QuotaClaim("listeners-tenant", "t1", 5)
    await store.quotas.acquire([meeting])
    with pytest.raises(QuotaFull) as refused:
        await store.quotas.acquire([tenant, meeting])
    assert refused.value.name == meeting.name
    assert store.quotas.held("listeners-tenant", "t1") == 0
    await store.quotas.acquire([tenant])  # untouched: the failed call took nothing


async def test_a_lease_taken_over_counts_once_and_survives_the_old_holders_release(
    store: Store,
) -> None:
    """A resumed source acquires under its session id while its old connection still holds
    it: no second slot; the old connection's release then leaves the new one's slot."""
    one = QuotaClaim("streams", "solo", 1)
    old = await store.quotas.acquire([one])
    old = await store.quotas.rebind(old, "session-1")  # the new source's id, learnt late
    new = await store.quotas.acquire([one], "session-1")
    await store.quotas.release(old)
    with pytest.raises(QuotaFull):
        await store.quotas.acquire([one])  # the new holder still has it
    await store.quotas.release(new)
    await store.quotas.acquire([one])


async def test_job_records_read_cancel_and_expire(store: Store) -> None:
    """A job's record reads back; a cancel hides it and makes the next write say so."""
    jobs = store.jobs
    assert await jobs.put("0123456789abcdef", b'{"s":1}', finished=False, ttl_s=60)
    entry = await jobs.get("0123456789abcdef")
    assert entry is not None
    assert (entry.body, entry.node, entry.finished, entry.node_alive) == (
        b'{"s":1}',
        store.node_id,
        False,
        True,
    )
    assert await jobs.request_cancel("0123456789abcdef")
    assert await jobs.get("0123456789abcdef") is None
    assert not await jobs.put("0123456789abcdef", b'{"s":2}', finished=False, ttl_s=60)
    assert not await jobs.request_cancel("fedcba9876543210")  # no such job
    await jobs.delete("0123456789abcdef")  # a tombstone: no write brings it back
    assert not await jobs.put("0123456789abcdef", b'{"s":3}', finished=True, ttl_s=60)
    assert await jobs.put("00000000000000ff", b'{"s":3}', finished=True, ttl_s=0.05)
    deadline = asyncio.get_running_loop().time() + SETTLE_S
    while await jobs.get("00000000000000ff") is not None:  # its TTL ran out
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.02)


def _redis_nodes(make_store: StoreFactory, request: pytest.FixtureRequest) -> list[RedisStore]:
    if "redis" not in request.node.callspec.id:
        pytest.skip("two nodes share state through Redis only")
    nodes: list[RedisStore] = []
    for _ in range(2):
        node = make_store(node_lease_s=LEASE_S)
        assert isinstance(node, RedisStore)
        nodes.append(node)
    return nodes


def _stop_heartbeat(node: RedisStore) -> None:
    """The node hangs or dies: it renews nothing from now on."""
    beat = node.quotas.heartbeat
    assert beat is not None
    beat.cancel()


async def test_quotas_count_across_nodes_and_a_dead_nodes_slots_expire(
    make_store: StoreFactory, request: pytest.FixtureRequest
) -> None:
    """Node A's slot counts on node B; when A stops renewing, B gets it after the lease."""
    a, b = _redis_nodes(make_store, request)
    one = QuotaClaim("streams", "shared", 1)
    await a.quotas.acquire([one])
    with pytest.raises(QuotaFull):
        await b.quotas.acquire([one])
    _stop_heartbeat(a)
    deadline = asyncio.get_running_loop().time() + SETTLE_S
    while True:
        try:
            await b.quotas.acquire([one])
            break
        except QuotaFull:
            assert asyncio.get_running_loop().time() < deadline, "A's slot never expired"
            await asyncio.sleep(0.05)


async def test_a_live_node_keeps_its_slots_past_the_lease(
    make_store: StoreFactory, request: pytest.FixtureRequest
) -> None:
    """The heartbeat renews: several lease times later A's slot still counts on B."""
    a, b = _redis_nodes(make_store, request)
    one = QuotaClaim("streams", "kept", 1)
    await a.quotas.acquire([one])
    for _ in range(3):
        await asyncio.sleep(LEASE_S)
        with pytest.raises(QuotaFull):
            await b.quotas.acquire([one])


async def test_a_dead_nodes_unfinished_job_reads_as_its_node_lost(
    make_store: StoreFactory, request: pytest.FixtureRequest
) -> None:
    """B reads A's running job with A alive, then, once A's lease expired, as node lost;
    a finished job stays finished whatever became of its node."""
    a, b = _redis_nodes(make_store, request)
    await a.jobs.put("aaaaaaaaaaaaaaaa", b"running", finished=False, ttl_s=60)
    await a.jobs.put("bbbbbbbbbbbbbbbb", b"done", finished=True, ttl_s=60)
    entry = await b.jobs.get("aaaaaaaaaaaaaaaa")
    assert entry is not None and entry.node == a.node_id and entry.node_alive
    _stop_heartbeat(a)
    deadline = asyncio.get_running_loop().time() + SETTLE_S
    while entry is not None and entry.node_alive:
        assert asyncio.get_running_loop().time() < deadline, "A's lease never expired"
        await asyncio.sleep(0.05)
        entry = await b.jobs.get("aaaaaaaaaaaaaaaa")
    assert entry is not None and not entry.node_alive and not entry.finished
    done = await b.jobs.get("bbbbbbbbbbbbbbbb")
    assert done is not None and done.finished and done.node_alive


async def test_takeovers_reach_the_other_nodes_only(
    make_store: StoreFactory, request: pytest.FixtureRequest
) -> None:
    """B hears A's announcement; A does not hear its own."""
    a, b = _redis_nodes(make_store, request)
    async with a.takeovers.watch() as heard_by_a, b.takeovers.watch() as heard_by_b:
        await a.takeovers.announce("meeting-1", "session-1")
        await b.takeovers.announce("meeting-2", "session-2")
        assert await anext(heard_by_b) == ("meeting-1", "session-1")
        assert await anext(heard_by_a) == ("meeting-2", "session-2")


async def test_a_malformed_takeover_is_skipped_and_the_watcher_goes_on(
    make_store: StoreFactory, request: pytest.FixtureRequest, redis_url: str, redis_prefix: str
) -> None:
    """Bad JSON and wrong shapes published on the takeovers channel (real Redis pub/sub)
    are logged and skipped: B's watcher (server.takeovers) keeps running and supersedes
    the good announcement that follows them."""
    a, b = _redis_nodes(make_store, request)
    heard: list[tuple[str, str]] = []
    arrived = asyncio.Event()

    class Recording(SessionRegistry):
        def supersede(self, meeting_id: str, session_id: str, keep: object = None) -> int:
            heard.append((meeting_id, session_id))
            arrived.set()
            return 0

    watcher = asyncio.create_task(watch_takeovers(b, Recording(4), retry_s=60.0))
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        async with asyncio.timeout(SETTLE_S):
            while not heard:  # subscribed once a probe arrives (pub/sub keeps nothing)
                await a.takeovers.announce("probe", "probe")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(arrived.wait(), 0.1)
        channel = f"{redis_prefix}takeovers"
        for bad in (b"{not json", b'{"a": 1}', b'["m", "s"]', b"[1, 2, 3]", b'"text"', b"\xff"):
            await client.publish(channel, bad)
        await a.takeovers.announce("meeting-9", "session-9")
        async with asyncio.timeout(SETTLE_S):
            while heard[-1] != ("meeting-9", "session-9"):
                arrived.clear()
                await arrived.wait()
        assert not watcher.done()
        assert set(heard) == {("probe", "probe"), ("meeting-9", "session-9")}
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        await client.aclose()


async def test_a_deleted_job_leaves_a_tombstone_no_late_write_undoes(store: Store) -> None:
    """A job's record deleted (its DELETE) while its node's sync write is in flight: the
    write lands after the delete and is refused (the node cancels), readers still find
    nothing, and the job reads as cancelled."""
    assert await store.jobs.put("cccccccccccccccc", b"running", finished=False, ttl_s=60)
    assert not await store.jobs.cancelled("cccccccccccccccc")
    await store.jobs.delete("cccccccccccccccc")
    late = await store.jobs.put("cccccccccccccccc", b"running", finished=False, ttl_s=60)
    assert late is False
    assert await store.jobs.get("cccccccccccccccc") is None
    assert await store.jobs.cancelled("cccccccccccccccc")
    assert await store.jobs.request_cancel("cccccccccccccccc") is False  # no such job
