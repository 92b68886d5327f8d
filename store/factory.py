"""`open_store()`: the store the settings ask for."""

from __future__ import annotations

import random

from store.api import DEFAULT_BUFFER_LIMIT, DEFAULT_NODE_LEASE_S, DEFAULT_PREFIX, Store
from store.memory import MemoryStore
from store.redis.store import RedisStore
from store.ttl import Clock, TTLSettings, system_clock


def open_store(
    redis_url: str | None,
    *,
    prefix: str = DEFAULT_PREFIX,
    ttl: TTLSettings | None = None,
    clock: Clock = system_clock,
    rng: random.Random | None = None,
    buffer_limit: int = DEFAULT_BUFFER_LIMIT,
    node_lease_s: float = DEFAULT_NODE_LEASE_S,
) -> Store:
    """The store the settings ask for: Redis when `redis_url` (PARLEY_REDIS_URL) is set,
    else the in-process MemoryStore. Opening connects nothing; call `ping()` to check."""
    if not redis_url:
        return MemoryStore(ttl=ttl, clock=clock, rng=rng)
    return RedisStore.from_url(
        redis_url,
        prefix=prefix,
        ttl=ttl,
        clock=clock,
        rng=rng,
        buffer_limit=buffer_limit,
        node_lease_s=node_lease_s,
    )
