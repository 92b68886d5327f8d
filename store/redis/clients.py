"""Redis clients from a URL: one Redis server (`redis://`, `rediss://`, `unix://`), or the
primary that Redis Sentinel names (`redis+sentinel://`), followed across failovers.

The Sentinel form (docs/store.md):

    redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service[/db][?options]

`host:port` pairs are the sentinels (port 26379 when left out), `service` the name they
monitor (`sentinel monitor <service> ...`), `db` the database (0). The password, if any,
is the primary's and its replicas'; `?sentinel_password=` is the sentinels' own. A client
asks a sentinel for the primary's address at each new connection; a primary that turned
replica answers READONLY, which drops the connection so the next one asks again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff

SENTINEL_SCHEME = "redis+sentinel"
SENTINEL_PORT = 26379
SENTINEL_OPTIONS = ("sentinel_password",)


@dataclass(frozen=True, slots=True)
class SentinelURL:
    """What a `redis+sentinel://` URL names."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None

    @classmethod
    def parse(cls, url: str) -> SentinelURL:
        """Read a `redis+sentinel://` URL; ValueError says what is wrong with it."""
        parts = urlsplit(url)
        if parts.scheme != SENTINEL_SCHEME:
            raise ValueError(f"not a {SENTINEL_SCHEME}:// URL")
        userinfo, _, hosts = parts.netloc.rpartition("@")
        username = password = None
        if userinfo:
            user, _, secret = userinfo.partition(":")
            username, password = unquote(user) or None, unquote(secret) or None
        sentinels = tuple(_host_port(item) for item in hosts.split(",") if item)
        if not sentinels:
            raise ValueError("names no sentinel (host:port before the path)")
        path = [p for p in parts.path.split("/") if p]
        if not path or len(path) > 2:
            raise ValueError("path must be /service or /service/db")
        db = 0
        if len(path) == 2:
            if not path[1].isdigit():
                raise ValueError(f"database {path[1]!r} is not a number")
            db = int(path[1])
        query = parse_qs(parts.query, keep_blank_values=True)
        unknown = sorted(set(query) - set(SENTINEL_OPTIONS))
        if unknown:
            known = ", ".join(SENTINEL_OPTIONS)
            raise ValueError(f"unknown option {unknown[0]!r} (known: {known})")
        sentinel_password = query.get("sentinel_password", [""])[-1] or None
        return cls(sentinels, unquote(path[0]), db, username, password, sentinel_password)


def _host_port(item: str) -> tuple[str, int]:
    if item.startswith("["):  # [IPv6]:port
        host, _, rest = item[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        host, _, port = item.rpartition(":") if ":" in item else (item, "", "")
    if not host:
        raise ValueError(f"sentinel {item!r} has no host")
    if port and not port.isdigit():
        raise ValueError(f"sentinel {item!r} has a port that is not a number")
    return host, int(port) if port else SENTINEL_PORT


def is_sentinel(url: str) -> bool:
    return url.startswith(SENTINEL_SCHEME + "://")


class BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """Connections to the primary Sentinel names, at most `max_connections`: calls beyond
    wait up to `timeout` for one to come free (as the store's plain pool does)."""


def redis_client(
    url: str,
    *,
    socket_timeout: float | None,
    connect_timeout: float,
    max_connections: int,
    client_name: str,
    reconnects: int = 1,
) -> Redis:
    """A client on its own pool of at most `max_connections`, to the server `url` names or
    to the primary its sentinels name. A call that loses its connection is retried
    `reconnects` times at once, on a new connection (with Sentinel: to the primary the
    sentinels name then); beyond that it fails as an unreachable Redis does."""
    options: dict[str, Any] = {
        "max_connections": max_connections,
        "timeout": socket_timeout,  # wait for a free connection at most this long
        "decode_responses": False,
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
        "retry": Retry(NoBackoff(), reconnects),
        "client_name": client_name,  # what `CLIENT LIST` shows for these connections
    }
    if not is_sentinel(url):
        return Redis.from_pool(BlockingConnectionPool.from_url(url, **options))
    named = SentinelURL.parse(url)
    sentinel = Sentinel(
        list(named.sentinels),
        sentinel_kwargs={
            "socket_timeout": connect_timeout,
            "socket_connect_timeout": connect_timeout,
            "password": named.sentinel_password,
        },
    )
    client: Redis = sentinel.master_for(
        named.service,
        connection_pool_class=BlockingSentinelPool,
        db=named.db,
        username=named.username,
        password=named.password,
        **options,
    )
    return client


def without_read_timeout(redis: Redis) -> Redis:
    """A client of the same server (the same Sentinel primary) whose connections wait on
    reads for ever: for a subscription, which is silent between messages."""
    pool = redis.connection_pool
    kwargs = {**pool.connection_kwargs, "socket_timeout": None}
    if isinstance(pool, SentinelConnectionPool):
        kwargs.pop("connection_pool", None)  # the new pool puts itself there
        sentinel_pool = SentinelConnectionPool(  # type: ignore[no-untyped-call]
            pool.service_name,
            pool.sentinel_manager,
            connection_class=pool.connection_class,
            **kwargs,
        )
        return Redis(connection_pool=sentinel_pool)
    return Redis(connection_pool=ConnectionPool(connection_class=pool.connection_class, **kwargs))


async def close_client(redis: Redis) -> None:
    """Close the client's pool and, with Sentinel, its connections to the sentinels."""
    pool = redis.connection_pool
    await redis.aclose()
    if isinstance(pool, SentinelConnectionPool):
        await pool.sentinel_manager.aclose()
