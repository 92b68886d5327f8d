"""Meeting tokens at rest: single-use grants keyed by the token's SHA-256, expiring.

`MemoryTokens` serves one node; `RedisTokens` lets a token minted on one node be spent
on another (and only once: GETDEL is atomic). Both hold only digests, never tokens.
A tenant may hold at most `per_tenant` unspent, unexpired tokens (TokenQuotaExceeded),
so one tenant cannot fill the store that every tenant mints from.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Protocol

import orjson
from redis.asyncio import Redis
from redis.exceptions import RedisError

from store.errors import StoreError, StoreOverloaded, StoreUnavailable
from store.redis.clients import close_client, redis_client

MAX_MEMORY_TOKENS = 100_000  # outstanding tokens one node holds before minting is refused
PER_TENANT = 1000  # outstanding tokens per tenant (PARLEY_MAX_TOKENS_PER_TENANT)
MAX_CONNECTIONS = 16  # to Redis, per node; more calls wait for one (up to the timeout)


class TokenQuotaExceeded(StoreError):
    """The tenant holds its quota of unspent tokens: minting waits until some are spent
    or expire (HTTP 429)."""


@dataclass(frozen=True, slots=True)
class TokenGrant:
    """What a meeting token opens: one connection to `meeting_id` for `tenant`."""

    tenant: str
    meeting_id: str
    scope: str | None  # "stream", "events", "transcript"; None: any of them
    participant: str | None  # the participant a stream must use, if bound
    expires_at: float  # epoch seconds


class TokenStore(Protocol):
    async def put(self, digest: str, grant: TokenGrant, ttl_s: float) -> None:
        """Keep `grant` under `digest` for `ttl_s`. Raises TokenQuotaExceeded when its
        tenant holds its quota, StoreOverloaded when full, StoreUnavailable when the
        backing store cannot be reached."""
        ...

    async def take(self, digest: str) -> TokenGrant | None:
        """Remove and return the grant (single use); None if unknown or expired."""
        ...

    async def close(self) -> None: ...


def _quota_exceeded(tenant: str, limit: int) -> TokenQuotaExceeded:
    who = f"tenant {tenant!r}" if tenant else "this server"
    return TokenQuotaExceeded(
        f"{who} holds {limit} unspent meeting tokens (the limit); spend them or let them expire"
    )


class MemoryTokens:
    def __init__(
        self,
        *,
        limit: int = MAX_MEMORY_TOKENS,
        per_tenant: int = PER_TENANT,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._limit = limit
        self._per_tenant = per_tenant
        self._clock = clock
        self._grants: dict[str, TokenGrant] = {}
        self._held: Counter[str] = Counter()  # grants per tenant

    def __len__(self) -> int:
        return len(self._grants)

    def _expire(self) -> None:
        now = self._clock()
        self._grants = {d: g for d, g in self._grants.items() if g.expires_at > now}
        self._held = Counter(g.tenant for g in self._grants.values())

    async def put(self, digest: str, grant: TokenGrant, ttl_s: float) -> None:
        if len(self._grants) >= self._limit or self._held[grant.tenant] >= self._per_tenant:
            self._expire()
            if self._held[grant.tenant] >= self._per_tenant:
                raise _quota_exceeded(grant.tenant, self._per_tenant)
            if len(self._grants) >= self._limit:
                raise StoreOverloaded(f"{self._limit} meeting tokens outstanding")
        self._grants[digest] = grant
        self._held[grant.tenant] += 1

    async def take(self, digest: str) -> TokenGrant | None:
        grant = self._grants.pop(digest, None)
        if grant is None:
            return None
        self._held[grant.tenant] -= 1
        return grant if grant.expires_at > self._clock() else None

    async def close(self) -> None:
        self._grants.clear()
        self._held.clear()


# KEYS[1] the token, KEYS[2] its tenant's tokens (sorted set: digest by expiry, ms).
# ARGV[1] grant JSON, [2] TTL ms, [3] now ms, [4] expires at ms, [5] per-tenant limit,
# [6] digest. Returns 1 if kept, 0 if the tenant holds its quota.
_PUT = """
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[3])
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[5]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[6])
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[2], ARGV[2]) end
return 1
"""


class RedisTokens:
    def __init__(self, redis: Redis, prefix: str, *, per_tenant: int = PER_TENANT) -> None:
        self._redis = redis
        self._prefix = prefix + "mtoken:"
        self._tenants = prefix + "mtoken-tenant:"
        self._per_tenant = per_tenant
        self._put = redis.register_script(_PUT)

    @classmethod
    def from_url(cls, url: str, prefix: str, *, per_tenant: int = PER_TENANT) -> RedisTokens:
        redis = redis_client(
            url,
            socket_timeout=5.0,
            connect_timeout=5.0,
            max_connections=MAX_CONNECTIONS,
            client_name="parley-tokens",
        )
        return cls(redis, prefix, per_tenant=per_tenant)

    async def put(self, digest: str, grant: TokenGrant, ttl_s: float) -> None:
        ttl_ms = max(1, int(ttl_s * 1000))
        now_ms = int(time.time() * 1000)
        try:
            kept = await self._put(
                keys=[self._prefix + digest, self._tenants + grant.tenant],
                args=[
                    orjson.dumps(asdict(grant)),
                    ttl_ms,
                    now_ms,
                    now_ms + ttl_ms,
                    self._per_tenant,
                    digest,
                ],
            )
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc
        if not kept:
            raise _quota_exceeded(grant.tenant, self._per_tenant)

    async def take(self, digest: str) -> TokenGrant | None:
        try:
            raw = await self._redis.getdel(self._prefix + digest)
            if raw is None:
                return None
            grant = TokenGrant(**orjson.loads(raw))
            await self._redis.zrem(self._tenants + grant.tenant, digest)
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc
        return grant if grant.expires_at > time.time() else None

    async def close(self) -> None:
        await close_client(self._redis)


def open_tokens(redis_url: str | None, prefix: str, *, per_tenant: int = PER_TENANT) -> TokenStore:
    """Tokens live where the meetings live: Redis when configured, else in this process."""
    if not redis_url:
        return MemoryTokens(per_tenant=per_tenant)
    return RedisTokens.from_url(redis_url, prefix, per_tenant=per_tenant)
