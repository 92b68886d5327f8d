"""Leases on Redis: this node's liveness and the quota slots it holds, shared by every
node and expiring when their node dies.

{prefix}node:{node id}            this node is alive (a string with a TTL of `lease_s`)
{prefix}quota:{name}:z:{key}      sorted set: lease id → expiry (ms, Redis' clock)
{prefix}quota:{name}:h:{key}      hash: lease id → holder (the connection that holds it)

A heartbeat task renews the node key and every lease the node holds, every third of
`lease_s`, in one script. A node that dies stops renewing: its node key expires, and its
quota slots are purged by the next acquire after their expiry. All times are Redis'
(`TIME`), so the nodes' clocks need not agree.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Sequence
from dataclasses import replace

from redis.asyncio import Redis

from store.api import Lease, QuotaClaim
from store.cancel import cancel_and_wait
from store.errors import QuotaFull
from store.redis.link import UNREACHABLE, Link, log_crash

logger = logging.getLogger(__name__)

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: (zset, hash) per claim. ARGV[1] lease id, [2] holder, [3] lease ms, [4..] limits.
# Returns 0 (taken), or the index of the first full claim.
LUA_ACQUIRE = (
    _NOW
    + """
local id, holder, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local n = #KEYS / 2
for i = 1, n do
  local z, h = KEYS[2 * i - 1], KEYS[2 * i]
  local gone = redis.call('ZRANGEBYSCORE', z, '-inf', now)
  if #gone > 0 then
    redis.call('ZREM', z, unpack(gone))
    redis.call('HDEL', h, unpack(gone))
  end
  if not redis.call('ZSCORE', z, id) and redis.call('ZCARD', z) >= tonumber(ARGV[3 + i]) then
    return i
  end
end
for i = 1, n do
  local z, h = KEYS[2 * i - 1], KEYS[2 * i]
  redis.call('ZADD', z, now + ttl, id)
  redis.call('HSET', h, id, holder)
  redis.call('PEXPIRE', z, ttl)
  redis.call('PEXPIRE', h, ttl)
end
return 0
"""
)

# KEYS: (zset, hash) per claim. ARGV[1] old id, [2] new id, [3] holder, [4] lease ms.
LUA_REBIND = (
    _NOW
    + """
for i = 1, #KEYS / 2 do
  local z, h = KEYS[2 * i - 1], KEYS[2 * i]
  if redis.call('HGET', h, ARGV[1]) == ARGV[3] then
    redis.call('ZREM', z, ARGV[1])
    redis.call('HDEL', h, ARGV[1])
    redis.call('ZADD', z, now + tonumber(ARGV[4]), ARGV[2])
    redis.call('HSET', h, ARGV[2], ARGV[3])
  end
end
return 0
"""
)

# KEYS: (zset, hash) per claim. ARGV[1] lease id, [2] holder.
LUA_RELEASE = """
for i = 1, #KEYS / 2 do
  local z, h = KEYS[2 * i - 1], KEYS[2 * i]
  if redis.call('HGET', h, ARGV[1]) == ARGV[2] then
    redis.call('ZREM', z, ARGV[1])
    redis.call('HDEL', h, ARGV[1])
  end
end
return 0
"""

# KEYS[1] the node key, then (zset, hash) per held slot. ARGV[1] lease ms, [2] node id,
# then the lease id of each slot. Returns the indexes (1-based) of slots found expired.
LUA_RENEW = (
    _NOW
    + """
local ttl = tonumber(ARGV[1])
redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl)
local lost = {}
for i = 1, (#KEYS - 1) / 2 do
  local z, h, id = KEYS[2 * i], KEYS[2 * i + 1], ARGV[2 + i]
  if redis.call('ZSCORE', z, id) then
    redis.call('ZADD', z, now + ttl, id)
    redis.call('PEXPIRE', z, ttl)
    redis.call('PEXPIRE', h, ttl)
  else
    lost[#lost + 1] = i
  end
end
return lost
"""
)


class RedisLeases:
    """This node's heartbeat and the quota slots it holds (the store's `quotas`)."""

    def __init__(self, redis: Redis, prefix: str, node_id: str, link: Link, lease_s: float) -> None:
        self._redis = redis
        self._prefix = prefix
        self.node_id = node_id
        self._link = link
        self._lease_ms = max(1, int(lease_s * 1000))
        self._acquire = redis.register_script(LUA_ACQUIRE)
        self._rebind = redis.register_script(LUA_REBIND)
        self._release = redis.register_script(LUA_RELEASE)
        self._renew = redis.register_script(LUA_RENEW)
        self._held: dict[tuple[str, str], Lease] = {}  # (lease id, holder) → lease
        self._beat: asyncio.Task[None] | None = None
        self._beating = asyncio.Event()

    def node_key(self, node_id: str) -> str:
        return f"{self._prefix}node:{node_id}"

    def _keys(self, claims: Sequence[QuotaClaim]) -> list[str]:
        keys: list[str] = []
        for claim in claims:
            base = f"{self._prefix}quota:{claim.name}:"
            keys += [base + "z:" + claim.key, base + "h:" + claim.key]
        return keys

    # -- liveness

    async def start(self) -> None:
        """Write this node's key now and keep renewing it (and its leases) until closed."""
        if self._beat is None:
            self._beat = asyncio.get_running_loop().create_task(
                self._heartbeat(), name="parley-store-heartbeat"
            )
            self._beat.add_done_callback(log_crash)
        await self._beating.wait()

    async def alive(self, node_id: str) -> bool:
        """Whether the node's lease is current. Raises StoreUnavailable."""
        try:
            found = await self._redis.exists(self.node_key(node_id))
        except UNREACHABLE as exc:
            raise self._link.unavailable(exc, "read a node's lease") from exc
        return bool(found)

    async def _heartbeat(self) -> None:
        while True:
            try:
                await self._renew_all()
            except UNREACHABLE as exc:
                self._link.note_failure(exc)
            self._beating.set()  # first try done, reached or not: callers go on
            await asyncio.sleep(self._lease_ms / 3000)

    async def _renew_all(self) -> None:
        held = list(self._held.values())
        slots = [(lease, claim) for lease in held for claim in lease.claims]
        keys = [self.node_key(self.node_id)]
        for _, claim in slots:
            keys += self._keys([claim])
        lost = await self._renew(
            keys=keys, args=[self._lease_ms, self.node_id, *(lease.id for lease, _ in slots)]
        )
        self._link.note_success()
        for index in lost:
            lease, claim = slots[int(index) - 1]
            logger.warning(
                "lease %s on quota %s of %r expired while held (Redis was out of reach "
                "longer than the lease); the slot is no longer counted",
                lease.id,
                claim.name,
                claim.key,
            )

    # -- quotas

    async def acquire(self, claims: Sequence[QuotaClaim], lease_id: str | None = None) -> Lease:
        await self.start()
        lease = Lease(lease_id or secrets.token_hex(8), secrets.token_hex(8), tuple(claims))
        try:
            full = await self._acquire(
                keys=self._keys(claims),
                args=[lease.id, lease.holder, self._lease_ms, *(c.limit for c in claims)],
            )
        except UNREACHABLE as exc:
            raise self._link.unavailable(exc, "take a quota slot") from exc
        self._link.note_success()
        if int(full):
            claim = claims[int(full) - 1]
            raise QuotaFull(claim.name, claim.key, claim.limit)
        self._held[lease.id, lease.holder] = lease
        return lease

    async def rebind(self, lease: Lease, lease_id: str) -> Lease:
        moved = replace(lease, id=lease_id)
        self._held.pop((lease.id, lease.holder), None)
        self._held[moved.id, moved.holder] = moved
        try:
            await self._rebind(
                keys=self._keys(lease.claims),
                args=[lease.id, lease_id, lease.holder, self._lease_ms],
            )
        except UNREACHABLE as exc:
            raise self._link.unavailable(exc, "rename a quota lease") from exc
        return moved

    async def release(self, lease: Lease) -> None:
        self._held.pop((lease.id, lease.holder), None)
        try:
            await self._release(keys=self._keys(lease.claims), args=[lease.id, lease.holder])
        except UNREACHABLE as exc:
            self._link.note_failure(exc)  # it expires by itself, `lease_s` from now

    def held(self, name: str, key: str) -> int:
        return sum(
            1
            for lease in self._held.values()
            for claim in lease.claims
            if claim.name == name and claim.key == key
        )

    @property
    def heartbeat(self) -> asyncio.Task[None] | None:
        """The task renewing this node's lease, while one runs."""
        return self._beat

    def __bool__(self) -> bool:
        return bool(self._held)

    async def close(self) -> None:
        """Stop the heartbeat and give this node's lease and slots back."""
        if self._beat is not None:
            await cancel_and_wait([self._beat])  # a plain cancel may be dropped: store/cancel.py
            self._beat = None
        for lease in list(self._held.values()):
            await self.release(lease)
        with contextlib.suppress(*UNREACHABLE):
            await self._redis.delete(self.node_key(self.node_id))
