"""The TTL policy: the pure function, and the TTLs both stores really give (Redis PTTL)."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio import Redis

from store.errors import UnknownResumeToken
from store.memory import MemoryStore
from store.redis.scripts import Keys
from store.redis.store import RedisStore
from store.ttl import MIN_TTL_MS, TTLSettings, draw_jitter, ttl_bounds_ms, ttl_ms
from tests.store.test_store import emit
from tests.support.redis_support import ManualClock

HOUR = 3600.0
POLICY = TTLSettings()  # the defaults documented in docs/store.md


def test_default_constants_are_the_documented_ones() -> None:
    """24 h base, floor 0.3 over 24 h of idleness, +10 % per access up to x2, ±15 %."""
    assert (POLICY.base_s, POLICY.floor, POLICY.decay_s) == (24 * HOUR, 0.3, 24 * HOUR)
    assert (POLICY.per_access, POLICY.cap, POLICY.jitter) == (0.1, 2.0, 0.15)
    assert POLICY.max_ttl_ms == int(24 * HOUR * 1000 * 2 * 1.15)


def test_ttl_known_values() -> None:
    """Spot values of the formula, without jitter."""
    day_ms = 24 * HOUR * 1000
    assert ttl_ms(POLICY, idle_s=0, accesses=1, u=0) == pytest.approx(day_ms * 1.1, abs=1)
    assert ttl_ms(POLICY, idle_s=0, accesses=10, u=0) == day_ms * 2
    assert ttl_ms(POLICY, idle_s=0, accesses=500, u=0) == day_ms * 2
    assert ttl_ms(POLICY, idle_s=12 * HOUR, accesses=10, u=0) == day_ms
    assert ttl_ms(POLICY, idle_s=30 * HOUR, accesses=10, u=0) == pytest.approx(day_ms * 0.6, abs=1)
    assert ttl_ms(POLICY, idle_s=0, accesses=10, u=1) == pytest.approx(day_ms * 2.3, abs=1)
    assert ttl_ms(POLICY, idle_s=0, accesses=10, u=-1) == pytest.approx(day_ms * 1.7, abs=1)


@given(
    idle=st.floats(0, 1000 * HOUR),
    accesses=st.integers(1, 10_000),
    u=st.floats(-1, 1),
)
def test_ttl_within_bounds(idle: float, accesses: int, u: float) -> None:
    """Every TTL lies between basexfloorx(1-jitter) and basexcapx(1+jitter), and in the
    jitter bounds of its own idle/accesses."""
    value = ttl_ms(POLICY, idle_s=idle, accesses=accesses, u=u)
    low, high = ttl_bounds_ms(POLICY, idle_s=idle, accesses=accesses)
    assert low <= value <= high
    assert int(24 * HOUR * 1000 * 0.3 * 0.85) - 1 <= value <= POLICY.max_ttl_ms


@given(
    idle=st.floats(0, 100 * HOUR),
    more_idle=st.floats(0, 100 * HOUR),
    accesses=st.integers(1, 100),
    more=st.integers(0, 100),
    u=st.floats(-1, 1),
)
def test_ttl_grows_with_activity_and_decays_with_idleness(
    idle: float, more_idle: float, accesses: int, more: int, u: float
) -> None:
    """More accesses never shorten the TTL; more idleness never lengthens it."""
    base = ttl_ms(POLICY, idle_s=idle, accesses=accesses, u=u)
    assert ttl_ms(POLICY, idle_s=idle, accesses=accesses + more, u=u) >= base
    assert ttl_ms(POLICY, idle_s=idle + more_idle, accesses=accesses, u=u) <= base


def test_settings_are_validated() -> None:
    """Nonsense constants are refused at construction."""
    for bad in [
        {"base_s": 0},
        {"floor": 0},
        {"floor": 1.5},
        {"decay_s": -1},
        {"cap": 0.5},
        {"jitter": 1.0},
        {"per_access": -0.1},
    ]:
        with pytest.raises(ValueError):
            TTLSettings(**bad)  # type: ignore[arg-type]
    assert ttl_ms(TTLSettings(base_s=0.01), idle_s=0, accesses=1, u=-1) == MIN_TTL_MS


# ---------------------------------------------------------------- MemoryStore


async def test_memory_ttl_grows_then_expires_when_idle(clock: ManualClock) -> None:
    """MemoryStore: TTL in bounds after N accesses; past it the meeting and tokens are gone."""
    store = MemoryStore(clock=clock, rng=random.Random(1))
    state, token = await store.create_source("m1", "alice")
    low, high = ttl_bounds_ms(POLICY, idle_s=0, accesses=1)
    assert low / 1000 <= (store.ttl("m1") or 0) <= high / 1000
    for n in range(2, 13):
        _, state = await emit(store, state)
        low, high = ttl_bounds_ms(POLICY, idle_s=0, accesses=n)
        assert low / 1000 <= (store.ttl("m1") or 0) <= high / 1000
    clock.advance(POLICY.max_ttl_ms / 1000 + 1)
    assert store.ttl("m1") is None
    assert await store.finals("m1") == []
    with pytest.raises(UnknownResumeToken):
        await store.resume_source("m1", token)


async def test_memory_read_after_idle_extends_by_decayed_lease(clock: ManualClock) -> None:
    """A transcript read after long idleness extends the TTL by the decayed amount only."""
    store = MemoryStore(clock=clock, rng=random.Random(2))
    state, _ = await store.create_source("m1", "alice")
    for _ in range(10):
        _, state = await emit(store, state)
    clock.advance(40 * HOUR)
    remaining = store.ttl("m1") or 0
    await store.finals("m1")
    low, high = ttl_bounds_ms(POLICY, idle_s=40 * HOUR, accesses=12)
    assert max(remaining, low / 1000) <= (store.ttl("m1") or 0) <= max(remaining, high / 1000)


# ---------------------------------------------------------------- Redis (real PTTL)


async def pttls(redis_url: str, keys: list[str]) -> list[int]:
    client = Redis.from_url(redis_url)
    try:
        return [await client.pttl(key) for key in keys]
    finally:
        await client.aclose()


def ms_since(started: float) -> int:
    """Real milliseconds since `started` (time.monotonic()), rounded up: the most a key's
    TTL can have run down between a write that began after `started` and a read before now.
    A loaded CI machine has taken ~0.5 s here, so the tolerance is measured, not assumed."""
    return int((time.monotonic() - started) * 1000) + 1


@pytest.fixture
async def redis_store(
    redis_url: str, redis_prefix: str, clock: ManualClock
) -> AsyncIterator[RedisStore]:
    store = RedisStore.from_url(redis_url, prefix=redis_prefix, clock=clock, rng=random.Random(5))
    yield store
    await store.close()


async def test_redis_pttl_matches_the_policy_exactly(
    redis_url: str, redis_prefix: str, clock: ManualClock
) -> None:
    """The Lua arithmetic gives the Python function's TTL to the millisecond (less the time
    since the write), on every key of the meeting, after each of N accesses."""
    store = RedisStore.from_url(redis_url, prefix=redis_prefix, clock=clock, rng=random.Random(9))
    draws = random.Random(9)  # the same jitter sequence: one draw per store call
    keys = Keys(redis_prefix).meeting("m1")
    try:
        started = time.monotonic()
        state, _ = await store.create_source("m1", "alice")
        expected = ttl_ms(POLICY, idle_s=0, accesses=1, u=draw_jitter(draws))
        ttls = await pttls(redis_url, keys[::2])  # meta and src (no log yet)
        for ttl in ttls:
            assert expected - ms_since(started) <= ttl <= expected
        for n in range(2, 16):
            started = time.monotonic()
            _, state = await emit(store, state)
            expected = ttl_ms(POLICY, idle_s=0, accesses=n, u=draw_jitter(draws))
            ttls = await pttls(redis_url, keys)
            for ttl in ttls:
                assert expected - ms_since(started) <= ttl <= expected
    finally:
        await store.close()


async def test_redis_read_after_idle_extends_only(
    redis_store: RedisStore, redis_url: str, redis_prefix: str, clock: ManualClock
) -> None:
    """After simulated idleness a read never shortens a longer TTL, and gives a key whose
    TTL ran down the decayed lease: base x max(0.3, 1 - idle/24 h) x growth ± 15 %."""
    keys = Keys(redis_prefix).meeting("m1")
    state, _ = await redis_store.create_source("m1", "alice")
    for _ in range(10):
        _, state = await emit(redis_store, state)
    started = time.monotonic()
    before = await pttls(redis_url, keys)
    clock.advance(20 * HOUR)
    await redis_store.finals("m1")  # access 12, idle 20 h: lease < the current TTL
    after = await pttls(redis_url, keys)
    elapsed = ms_since(started)
    assert all(b - elapsed <= a <= b for a, b in zip(after, before, strict=True))

    client = Redis.from_url(redis_url)
    try:  # let the TTLs "run down" as 20 h of real time would have
        for key in keys:
            await client.pexpire(key, 5_000)
    finally:
        await client.aclose()
    started = time.monotonic()
    await redis_store.finals("m1")  # access 13
    low, high = ttl_bounds_ms(POLICY, idle_s=20 * HOUR, accesses=13)
    ttls = await pttls(redis_url, keys)
    for ttl in ttls:
        assert low - ms_since(started) <= ttl <= high
    assert high < ttl_bounds_ms(POLICY, idle_s=0, accesses=13)[0]  # decayed indeed


async def test_redis_jitter_spreads_expiry(
    redis_store: RedisStore, redis_url: str, redis_prefix: str
) -> None:
    """Forty meetings created at the same instant get TTLs spread over the jitter band."""
    keys = Keys(redis_prefix)
    for i in range(40):
        await redis_store.create_source(f"m{i}", "alice")
    ttls = [(await pttls(redis_url, keys.meeting(f"m{i}")[:1]))[0] for i in range(40)]
    low, high = ttl_bounds_ms(POLICY, idle_s=0, accesses=1)
    assert all(low - 1000 <= t <= high for t in ttls)
    assert len(set(ttls)) == 40
    assert max(ttls) - min(ttls) > 0.6 * (high - low)  # not bunched
    assert statistics.pstdev(ttls) > 0.2 * (high - low)  # uniform: stdev = 0.29 x width


async def test_redis_token_hint_expires_with_the_longest_ttl(
    redis_store: RedisStore, redis_url: str, redis_prefix: str
) -> None:
    """The token → meeting hint key lives as long as the longest TTL the policy gives."""
    client = Redis.from_url(redis_url)
    try:
        await redis_store.create_source("m1", "alice")
        [hint] = [k async for k in client.scan_iter(match=redis_prefix + "token:*")]
        assert POLICY.max_ttl_ms - 1000 <= await client.pttl(hint) <= POLICY.max_ttl_ms
    finally:
        await client.aclose()
