"""Meeting tokens at rest: single-use grants keyed by the token's SHA-256, expiring.

`MemoryTokens` serves one node; `RedisTokens` lets a token minted on one node be spent
on another (and only once: GETDEL is atomic). Both hold only digests, never tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Protocol

import orjson
from redis.asyncio import Redis
from redis.exceptions import RedisError

from session.store import StoreOverloaded, StoreUnavailable

MAX_MEMORY_TOKENS = 100_000  # outstanding tokens one node holds before minting is refused


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
        """Keep `grant` under `digest` for `ttl_s`. Raises StoreOverloaded when full,
        StoreUnavailable when the backing store cannot be reached."""
        ...

    async def take(self, digest: str) -> TokenGrant | None:
        """Remove and return the grant (single use); None if unknown or expired."""
        ...

    async def close(self) -> None: ...


class MemoryTokens:
    def __init__(
        self, *, limit: int = MAX_MEMORY_TOKENS, clock: Callable[[], float] = time.time
    ) -> None:
        self._limit = limit
        self._clock = clock
        self._grants: dict[str, TokenGrant] = {}

    def __len__(self) -> int:
        return len(self._grants)

    async def put(self, digest: str, grant: TokenGrant, ttl_s: float) -> None:
        if len(self._grants) >= self._limit:
            now = self._clock()
            self._grants = {d: g for d, g in self._grants.items() if g.expires_at > now}
            if len(self._grants) >= self._limit:
                raise StoreOverloaded(f"{self._limit} meeting tokens outstanding")
        self._grants[digest] = grant

    async def take(self, digest: str) -> TokenGrant | None:
        grant = self._grants.pop(digest, None)
        if grant is None or grant.expires_at <= self._clock():
            return None
        return grant

    async def close(self) -> None:
        self._grants.clear()


class RedisTokens:
    def __init__(self, redis: Redis, prefix: str) -> None:
        self._redis = redis
        self._prefix = prefix + "mtoken:"

    @classmethod
    def from_url(cls, url: str, prefix: str) -> RedisTokens:
        return cls(Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0), prefix)

    async def put(self, digest: str, grant: TokenGrant, ttl_s: float) -> None:
        try:
            await self._redis.set(
                self._prefix + digest, orjson.dumps(asdict(grant)), px=max(1, int(ttl_s * 1000))
            )
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc

    async def take(self, digest: str) -> TokenGrant | None:
        try:
            raw = await self._redis.getdel(self._prefix + digest)
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc
        if raw is None:
            return None
        grant = TokenGrant(**orjson.loads(raw))
        return grant if grant.expires_at > time.time() else None

    async def close(self) -> None:
        await self._redis.aclose()


def open_tokens(redis_url: str | None, prefix: str) -> TokenStore:
    """Tokens live where the meetings live: Redis when configured, else in this process."""
    if not redis_url:
        return MemoryTokens()
    return RedisTokens.from_url(redis_url, prefix)
