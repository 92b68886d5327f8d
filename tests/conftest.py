"""Shared fixtures: a Redis for the whole run (the configured one, the local one, or one
started here), a key prefix per test that is deleted afterwards, and the stores."""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from redis.asyncio import Redis

from session.redis_store import RedisStore
from session.store import MemoryStore, Store
from tests.redis_support import ManualClock, RedisServer, redis_answers

StoreFactory = Callable[..., Store]


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """PARLEY_TEST_REDIS_URL, else 127.0.0.1:6379 if it answers, else a redis-server of ours."""
    configured = os.environ.get("PARLEY_TEST_REDIS_URL")
    if configured:
        yield configured
        return
    if redis_answers("127.0.0.1", 6379):
        yield "redis://127.0.0.1:6379/0"
        return
    server = RedisServer(tmp_path_factory.mktemp("redis"), persistent=False)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
async def redis_prefix(redis_url: str) -> AsyncIterator[str]:
    """A key prefix of this test's own; every key under it is deleted afterwards."""
    prefix = f"parley-test:{uuid.uuid4().hex[:12]}:"
    yield prefix
    client = Redis.from_url(redis_url)
    try:
        keys = [key async for key in client.scan_iter(match=prefix + "*", count=1000)]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=["memory", "redis"])
async def make_store(
    request: pytest.FixtureRequest, redis_url: str, redis_prefix: str, clock: ManualClock
) -> AsyncIterator[StoreFactory]:
    """Build stores of the parametrised backend (all on the same Redis prefix), closed after
    the test."""
    stores: list[Store] = []

    def build(**options: Any) -> Store:
        options.setdefault("clock", clock)
        options.setdefault("rng", random.Random(7))
        store: Store
        if request.param == "memory":
            store = MemoryStore(**options)
        else:
            store = RedisStore.from_url(redis_url, prefix=redis_prefix, **options)
        stores.append(store)
        return store

    yield build
    for store in stores:
        await store.close()


@pytest.fixture
def store(make_store: StoreFactory) -> Store:
    return make_store()
