"""The Redis store's connections under real faults: a listener idle for longer than the
socket timeout, and a Redis that goes silent without closing (half-open)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from store.errors import SubscriptionLost
from store.redis.store import RedisStore
from tests.store.test_store import next_event
from tests.support.redis_support import free_port


class SilentProxy:
    """A TCP proxy to Redis that can go silent: it stops forwarding in both directions
    and never closes, as a peer behind a dead network path does (half-open)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self.silent = False
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def __aenter__(self) -> SilentProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers += [writer, up_writer]
        await asyncio.gather(
            self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True
        )

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            if not self.silent:
                writer.write(data)
                await writer.drain()


async def test_an_idle_listener_keeps_its_subscription(redis_url: str, redis_prefix: str) -> None:
    """A listener hears nothing for five times the store's socket timeout, then a final is
    published: it arrives (the pub/sub connection has no read timeout to trip, whatever
    the redis-py version: 5.x raised TimeoutError after one socket timeout and every
    listener of the node was dropped)."""
    store = RedisStore.from_url(redis_url, prefix=redis_prefix, socket_timeout=0.2)
    try:
        async with store.subscribe("idle") as events:
            await asyncio.sleep(1.0)
            await store.publish("idle", b"final")
            assert await asyncio.wait_for(next_event(events), 5) == b"final"
    finally:
        await store.close()


async def test_a_silent_redis_drops_listeners_instead_of_holding_them(
    redis_url: str, redis_prefix: str
) -> None:
    """The path to Redis goes silent with the connection open: the subscription's health
    pings go unanswered and the listeners are told (SubscriptionLost) within two ping
    intervals, instead of waiting for ever for events that cannot come."""
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    async with SilentProxy(port) as proxy:
        store = RedisStore.from_url(
            proxy.url, prefix=redis_prefix, socket_timeout=0.2, pubsub_ping_s=0.3
        )
        try:
            async with store.subscribe("silent") as events:
                await store.publish("silent", b"before")
                assert await asyncio.wait_for(next_event(events), 5) == b"before"
                await asyncio.sleep(1.0)  # idle but healthy: pings are answered
                proxy.silent = True
                started = asyncio.get_running_loop().time()
                with pytest.raises(SubscriptionLost):
                    await asyncio.wait_for(next_event(events), 5)
                assert asyncio.get_running_loop().time() - started < 2.0
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(store.close(drain_timeout=0.1), 5)
