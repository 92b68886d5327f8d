"""Live meeting events through Redis pub/sub: one shared subscription per process, fanned
out to each listener's bounded queue. Publishing is best effort (events are not buffered
while Redis is away: listeners lost the connection too, and catch up from the log).

The subscription's connection has no read timeout, whatever the redis-py version (5.x
applied the pool's socket timeout to a blocking read and dropped every listener of an
idle node after it): it waits for events as long as there are none. A path to Redis
that dies without closing (half-open) is found by pings instead: after `ping_s` without
a message the reader pings, and a ping unanswered for `ping_s` drops the subscription
(every listener gets SubscriptionLost, reconnects, and catches up from the log)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from store.cancel import cancel_and_wait
from store.errors import StoreUnavailable, SubscriptionLost
from store.listener import Listener
from store.memory_cluster import decoded_takeovers, encode_takeover
from store.redis.link import UNREACHABLE, Link, log_crash
from store.redis.scripts import Keys

logger = logging.getLogger(__name__)


PING_S = 5.0  # seconds of silence on the subscription before it is pinged


class RedisEvents:
    """Publish to and subscribe to the meetings' event channels. `redis` publishes;
    `subscriber` (whose connections have no read timeout) holds the subscription."""

    def __init__(
        self,
        redis: Redis,
        subscriber: Redis,
        keys: Keys,
        link: Link,
        *,
        subscriber_queue: int,
        read_wait_s: float,
        ping_s: float = PING_S,
    ) -> None:
        self._redis = redis
        self._subscriber = subscriber
        self._ping_s = ping_s
        self._keys = keys
        self._link = link
        self._subscriber_queue = subscriber_queue
        self._read_wait_s = read_wait_s
        self._pubsub: PubSub | None = None
        self._pool_retry: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._channels: dict[bytes, set[Listener]] = {}
        self._confirm: dict[bytes, asyncio.Future[None]] = {}
        self._sub_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    async def publish(self, meeting_id: str, event: bytes) -> None:
        await self.publish_to(self._keys.events(meeting_id), event)

    async def publish_to(self, channel: bytes, event: bytes) -> None:
        try:
            await self._redis.publish(channel, event)
        except UNREACHABLE as exc:
            # Live events are not buffered: listeners lost the connection too and will
            # catch up from the log once they reconnect.
            self._link.note_failure(exc)

    def subscribe(
        self, meeting_id: str
    ) -> contextlib.AbstractAsyncContextManager[AsyncIterator[bytes]]:
        return self.subscribe_to(self._keys.events(meeting_id))

    @contextlib.asynccontextmanager
    async def subscribe_to(self, channel: bytes) -> AsyncIterator[AsyncIterator[bytes]]:
        """Listen to one channel from now on (a meeting's events, the takeovers)."""
        listener = Listener(self._subscriber_queue)
        await self._listen(channel, listener)
        try:
            yield listener.events()
        finally:
            self._unlisten(channel, listener)

    async def _listen(self, channel: bytes, listener: Listener) -> None:
        async with self._sub_lock:
            if self._closed:
                raise StoreUnavailable("the store is closed")
            listeners = self._channels.get(channel)
            if listeners is not None:
                listeners.add(listener)
                return
            self._channels[channel] = {listener}
            confirmed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._confirm[channel] = confirmed
            try:
                pubsub = await self._connect_pubsub()
                await pubsub.subscribe(channel)
                await asyncio.wait_for(asyncio.shield(confirmed), self._read_wait_s)
            except (*UNREACHABLE, TimeoutError) as exc:
                self._forget_channel(channel)
                raise self._link.unavailable(exc, "subscribe to the meeting's events") from exc
            except BaseException:
                self._forget_channel(channel)
                raise

    def _forget_channel(self, channel: bytes) -> None:
        self._channels.pop(channel, None)
        future = self._confirm.pop(channel, None)
        if future is not None and not future.done():
            future.cancel()
        if self._pubsub is not None:
            self._spawn(self._unsubscribe(channel))

    async def _connect_pubsub(self) -> PubSub:
        if self._pubsub is None:
            pubsub = self._subscriber.pubsub()
            await pubsub.connect()  # type: ignore[no-untyped-call]
            # No silent reconnect: redis-py would resubscribe and the events published
            # in between would be lost without the listeners knowing.
            assert pubsub.connection is not None
            self._pool_retry = pubsub.connection.retry
            pubsub.connection.retry = Retry(NoBackoff(), 0)
            self._pubsub = pubsub
            self._reader = asyncio.get_running_loop().create_task(
                self._read(pubsub), name="parley-store-pubsub"
            )
            self._reader.add_done_callback(log_crash)
        return self._pubsub

    async def _read(self, pubsub: PubSub) -> None:
        why = "the subscription reader stopped"
        loop = asyncio.get_running_loop()
        pinged: float | None = None  # when the unanswered ping went out
        try:
            while True:
                message = await pubsub.get_message(timeout=self._ping_s)
                if message is None:
                    if pinged is not None and loop.time() - pinged >= self._ping_s:
                        raise RedisConnectionError(f"no answer to a ping in {self._ping_s:g} s")
                    if pinged is None:
                        pinged = loop.time()
                        await pubsub.ping()
                    continue
                pinged = None  # anything from Redis proves the path is alive
                kind, channel = message["type"], message["channel"]
                if kind == "message":
                    listeners = self._channels.get(channel)
                    for listener in list(listeners or ()):
                        if not listener.offer(message["data"]):
                            listeners.discard(listener)  # type: ignore[union-attr]
                elif kind == "subscribe":  # the confirmation `_listen` waits for
                    future = self._confirm.pop(channel, None)
                    if future is not None and not future.done():
                        future.set_result(None)
        except UNREACHABLE as exc:
            self._link.note_failure(exc)
            why = f"redis unreachable ({self._link.last_error})"
        except RedisError:
            logger.exception("the meeting events subscription failed")
            why = "the subscription failed (see log)"
        self._lose_pubsub(pubsub, why)

    def _lose_pubsub(self, pubsub: PubSub, why: str) -> None:
        """The shared subscription broke: events may be lost, so drop every listener."""
        if self._pubsub is not pubsub:
            return
        self._pubsub = None
        self._reader = None
        for listeners in self._channels.values():
            for listener in listeners:
                listener.drop(SubscriptionLost(f"meeting events interrupted: {why}"))
        self._channels.clear()
        for future in self._confirm.values():
            if not future.done():
                future.set_exception(RedisConnectionError(why))
        self._confirm.clear()
        self._spawn(self._close_pubsub(pubsub))

    def _unlisten(self, channel: bytes, listener: Listener) -> None:
        listeners = self._channels.get(channel)
        if listeners is None:
            return
        listeners.discard(listener)
        if not listeners:
            self._spawn(self._unsubscribe(channel))

    async def _unsubscribe(self, channel: bytes) -> None:
        async with self._sub_lock:
            if self._channels.get(channel):
                return  # a listener came back meanwhile
            self._channels.pop(channel, None)
            if self._pubsub is not None:
                with contextlib.suppress(*UNREACHABLE):
                    await self._pubsub.unsubscribe(channel)

    async def _close_pubsub(self, pubsub: PubSub) -> None:
        connection = pubsub.connection
        with contextlib.suppress(*UNREACHABLE):
            # redis-py before 8.2 leaves aclose untyped; 8.2 types it
            await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]
        if connection is not None and self._pool_retry is not None:
            connection.retry = self._pool_retry  # back in the pool: the pool's policy

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def held(self) -> dict[str, int]:
        """What it holds now: subscribed channels (`takeovers` ones apart: a node's own,
        for its life), subscriptions awaiting Redis's confirmation, unsubscribes running."""
        channels = [c for c in self._channels if not c.endswith(b"takeovers")]
        return {
            "channels": len(channels),
            "confirmations": len(self._confirm),
            "tasks": len(self._tasks),
        }

    async def close(self) -> None:
        """Drop every listener (SubscriptionLost) and close the subscription."""
        self._closed = True
        tasks = [t for t in (self._reader, *self._tasks) if t is not None]
        await cancel_and_wait(tasks)  # a plain cancel may be dropped: store/cancel.py
        for listeners in self._channels.values():
            for listener in listeners:
                listener.drop(SubscriptionLost("the store was closed"))
        self._channels.clear()
        if self._pubsub is not None:
            await self._close_pubsub(self._pubsub)
            self._pubsub = None
        await self._subscriber.aclose()


class RedisTakeovers:
    """Takeovers through the channel `{prefix}takeovers`: every node hears every resume
    (they are rare) and supersedes the old connection if it serves it."""

    def __init__(self, events: RedisEvents, prefix: str, node_id: str) -> None:
        self._events = events
        self._node_id = node_id
        self._channel = f"{prefix}takeovers".encode()

    async def announce(self, meeting_id: str, session_id: str) -> None:
        await self._events.publish_to(
            self._channel, encode_takeover(meeting_id, session_id, self._node_id)
        )

    @contextlib.asynccontextmanager
    async def watch(self) -> AsyncIterator[AsyncIterator[tuple[str, str]]]:
        async with self._events.subscribe_to(self._channel) as events:
            yield decoded_takeovers(events, self._node_id)
