"""`RedisStore`: the `Store` semantics on Redis, shared by every server process.

Writes are Lua scripts (store/redis/scripts.py); while Redis cannot be reached they wait
in a bounded buffer with provisional seqs (store/redis/buffer.py); live events go through
pub/sub (store/redis/events.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson
from redis.asyncio import Redis

from store.api import (
    DEFAULT_BUFFER_LIMIT,
    DEFAULT_NODE_LEASE_S,
    DEFAULT_PREFIX,
    SUBSCRIBER_QUEUE,
)
from store.errors import (
    ResumeTokenMismatch,
    SourceSuperseded,
    StoreUnavailable,
    UnknownResumeToken,
)
from store.keyed_locks import KeyedLocks
from store.memory_cluster import new_node_id
from store.records import (
    FinalRecord,
    NewFinal,
    SourceState,
    StoreHealth,
    check_append,
    hash_token,
    new_source,
)
from store.redis.buffer import PendingFinal, PendingSource, WriteBuffer
from store.redis.clients import close_client, redis_client, without_read_timeout
from store.redis.enrolled import RedisSpeakerBook
from store.redis.events import PING_S, RedisEvents, RedisTakeovers
from store.redis.jobs import RedisJobs
from store.redis.leases import RedisLeases
from store.redis.link import UNREACHABLE, Link
from store.redis.scripts import (
    LUA_APPEND,
    LUA_CREATE,
    LUA_RESUME,
    LUA_TOUCH,
    SUPERSEDED,
    Keys,
)
from store.redis.speakers import relabelled, write_speakers
from store.ttl import Clock, TTLSettings, draw_jitter, system_clock
from wire.query import validate_id

logger = logging.getLogger(__name__)

FINALS_PAGE = 500  # finals per XRANGE when reading a log
# Connections a store keeps to Redis at most (the subscription has its own). Calls beyond
# wait up to the socket timeout for one to come free, then fail as Redis being down would.
MAX_CONNECTIONS = 32


class RedisStore:
    """The Store on Redis. Build it with `from_url`; one instance per process."""

    backend = "redis"

    def __init__(
        self,
        redis: Redis,
        *,
        prefix: str = DEFAULT_PREFIX,
        ttl: TTLSettings | None = None,
        clock: Clock = system_clock,
        rng: random.Random | None = None,
        buffer_limit: int = DEFAULT_BUFFER_LIMIT,
        subscriber_queue: int = SUBSCRIBER_QUEUE,
        read_wait_s: float = 2.0,
        retry_delays: tuple[float, float] = (0.05, 1.0),
        owns_client: bool = False,
        pubsub_ping_s: float = PING_S,
        node_lease_s: float = DEFAULT_NODE_LEASE_S,
        node_id: str | None = None,
    ) -> None:
        self._redis = redis
        self._keys = Keys(prefix)
        self._ttl = ttl or TTLSettings()
        self._ttl_args = self._ttl.lua_args()
        self._hint_ttl_ms = str(self._ttl.max_ttl_ms)
        self._clock = clock
        self._rng = rng or random.Random()
        self._read_wait_s = read_wait_s
        self._owns_client = owns_client
        self._create = redis.register_script(LUA_CREATE)
        self._append = redis.register_script(LUA_APPEND)
        self._touch = redis.register_script(LUA_TOUCH)
        self._resume = redis.register_script(LUA_RESUME)
        self._locks = KeyedLocks()
        self._link = Link()
        self.speakers = RedisSpeakerBook(redis, prefix, self._link)
        self._buffer = WriteBuffer(
            buffer_limit,
            self._link,
            retry_delays,
            apply_source=self._apply_source,
            apply_final=self._replay_final,
        )
        self._seqs = self._buffer.seqs
        self._events = RedisEvents(
            redis,
            without_read_timeout(redis),
            self._keys,
            self._link,
            subscriber_queue=subscriber_queue,
            read_wait_s=read_wait_s,
            ping_s=pubsub_ping_s,
        )
        self.node_id = node_id or new_node_id()
        self.quotas = RedisLeases(redis, prefix, self.node_id, self._link, node_lease_s)
        self.jobs = RedisJobs(redis, prefix, self.quotas, self._link)
        self.takeovers = RedisTakeovers(self._events, prefix, self.node_id)
        self._closed = False

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        socket_timeout: float = 1.0,
        connect_timeout: float = 0.5,
        max_connections: int = MAX_CONNECTIONS,
        client_name: str = "parley-store",
        **options: Any,
    ) -> RedisStore:
        """A store on its own pool of at most `max_connections`, to the server `url` names
        or, for `redis+sentinel://`, to the primary its sentinels name (store/redis/clients.py).
        Redis' own retries are reduced to one immediate reconnect: the write buffer, not a
        blocked caller, rides out outages and failovers."""
        redis = redis_client(
            url,
            socket_timeout=socket_timeout,
            connect_timeout=connect_timeout,
            max_connections=max_connections,
            client_name=client_name,
        )
        return cls(redis, prefix=prefix, owns_client=True, **options)

    # -- small helpers

    def _ttl_argv(self, now: float) -> list[str]:
        return [repr(now), repr(draw_jitter(self._rng)), *self._ttl_args]

    @property
    def resequenced(self) -> int:
        """Buffered finals whose provisional seq had to change (another node wrote)."""
        return self._buffer.resequenced

    async def _wait_drained(self, meeting_id: str) -> None:
        await self._buffer.wait_drained(meeting_id, self._read_wait_s)

    # -- sources

    async def create_source(
        self,
        meeting_id: str,
        participant: str,
        config: Mapping[str, Any] | None = None,
        *,
        origin: float | None = None,
    ) -> tuple[SourceState, str]:
        self._keys.meeting(meeting_id)  # validates the id
        state, token = new_source(
            meeting_id, participant, self._clock() if origin is None else origin
        )
        pending = PendingSource(
            meeting_id=meeting_id,
            state=state,
            digest=hash_token(token),
            config=orjson.dumps(dict(config)) if config is not None else b"",
            now=self._clock(),
        )
        async with self._locks(meeting_id):
            self._buffer.check_admission()
            if not self._buffer:
                try:
                    last = await self._apply_source(pending)
                except UNREACHABLE as exc:
                    self._link.note_failure(exc)
                else:
                    self._link.note_success()
                    self._buffer.remember(meeting_id, last, stored=True)
                    return state, token
            if self._seqs.known(meeting_id) is None:
                raise StoreUnavailable(
                    f"redis unreachable ({self._link.last_error}): cannot open meeting "
                    f"{meeting_id!r}, whose last seq this node does not know for sure"
                )
            self._buffer.enqueue(pending)
            return state, token

    async def _apply_source(self, pending: PendingSource) -> int:
        state = pending.state
        result = await self._create(
            keys=[*self._keys.meeting(pending.meeting_id), self._keys.token(pending.digest)],
            args=[
                *self._ttl_argv(pending.now),
                state.session_id,
                pending.digest,
                orjson.dumps(state.stored()),
                pending.config,
                state.meeting_id,
                self._hint_ttl_ms,
            ],
        )
        return int(result)

    async def resume_source(
        self, meeting_id: str, token: str, participant: str | None = None
    ) -> SourceState:
        keys = self._keys.meeting(meeting_id)
        if participant is not None:
            validate_id("participant", participant)
        digest = hash_token(token)
        await self._wait_drained(meeting_id)
        async with self._locks(meeting_id):
            self._buffer.check_admission()
            try:
                result = await self._resume(
                    keys=[*keys, self._keys.token(digest)],
                    args=[
                        *self._ttl_argv(self._clock()),
                        digest,
                        participant or "",
                        self._hint_ttl_ms,
                    ],
                )
            except UNREACHABLE as exc:
                raise self._link.unavailable(exc, "resume a session") from exc
            if int(result[0]) == 1:
                self._buffer.remember(meeting_id, int(result[4]), stored=True)
        self._link.note_success()
        status = int(result[0])
        if status == 0:
            hint = result[1]
            if hint is not None and hint.decode() != meeting_id:
                raise ResumeTokenMismatch("the resume token belongs to another meeting")
            raise UnknownResumeToken("unknown or expired resume token")
        if status == 2:
            raise ResumeTokenMismatch("the resume token belongs to another participant")
        _, session_id, state, generation, _ = result
        return SourceState.from_stored(
            meeting_id, session_id.decode(), int(generation), orjson.loads(state)
        )

    async def meeting_config(self, meeting_id: str) -> dict[str, Any] | None:
        meta = self._keys.meeting(meeting_id)[0]
        await self._wait_drained(meeting_id)
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.exists(meta)
                pipe.hget(meta, "cfg")
                exists, config = await pipe.execute()
        except UNREACHABLE as exc:
            raise self._link.unavailable(exc, "read the meeting config") from exc
        self._link.note_success()
        if not exists:
            return None
        loaded: dict[str, Any] = orjson.loads(config) if config is not None else {}
        return loaded

    # -- finals

    async def append_final(
        self, meeting_id: str, final: NewFinal, source: SourceState
    ) -> FinalRecord:
        check_append(meeting_id, final, source)
        async with self._locks(meeting_id):
            if self._closed:
                raise StoreUnavailable("the store is closed")
            now = self._clock()
            if not self._buffer:
                last = self._seqs.last(meeting_id)
                lowest = last + 1 if last is not None else 0
                try:
                    status, seq = await self._apply_final(
                        meeting_id, final, source, now, lowest, replay=False
                    )
                except UNREACHABLE as exc:
                    self._link.note_failure(exc)
                except asyncio.CancelledError:
                    # Redis may have logged it: until Redis tells us the meeting's last seq
                    # again, this node must not hand out provisional seqs for it.
                    self._seqs.doubt(meeting_id)
                    raise
                else:
                    self._link.note_success()
                    if status == SUPERSEDED:
                        raise SourceSuperseded(
                            f"source {source.session_id} was resumed by another session"
                        )
                    self._buffer.remember(meeting_id, seq)
                    return FinalRecord.from_new(seq, final)
            return self._buffer.provisional(meeting_id, final, source, now)

    async def _apply_final(
        self,
        meeting_id: str,
        final: NewFinal,
        source: SourceState,
        now: float,
        lowest: int,
        *,
        replay: bool,
    ) -> tuple[int, int]:
        status, value = await self._append(
            keys=self._keys.meeting(meeting_id),
            args=[
                *self._ttl_argv(now),
                source.session_id,
                final.utterance_id,
                orjson.dumps(final),
                orjson.dumps(source.stored()),
                source.generation,
                lowest,
                "1" if replay else "0",
            ],
        )
        return int(status), int(value)

    async def _replay_final(self, pending: PendingFinal) -> int:
        """Log one buffered final (the buffer's replay task calls this); its seq."""
        record = pending.record
        final = NewFinal(**{k: v for k, v in record.as_dict().items() if k != "seq"})
        _, value = await self._apply_final(
            pending.meeting_id, final, pending.source, pending.now, record.seq, replay=True
        )
        return value

    async def flushed(self, within_s: float) -> bool:
        """Wait until the write buffer is empty; False if it is not within `within_s`."""
        return await self._buffer.flushed(within_s)

    async def finals(self, meeting_id: str, after_seq: int = 0) -> list[FinalRecord]:
        keys = self._keys.meeting(meeting_id)
        await self._wait_drained(meeting_id)
        records: list[FinalRecord] = []
        try:
            if not await self._touch(keys=keys, args=self._ttl_argv(self._clock())):
                return records
            start = f"{max(0, int(after_seq)) + 1}-0"
            while True:  # pages keep each XRANGE short for Redis and for our parser
                page: Any = await self._redis.xrange(keys[1], min=start, count=FINALS_PAGE)
                for entry_id, entry in page:
                    seq = int(entry_id.split(b"-", 1)[0])
                    records.append(FinalRecord(seq=seq, **orjson.loads(entry[b"f"])))
                if len(page) < FINALS_PAGE:
                    break
                start = f"{records[-1].seq + 1}-0"
            records = await relabelled(self._redis, keys[2], records)
        except UNREACHABLE as exc:
            raise self._link.unavailable(exc, "read the transcript") from exc
        self._link.note_success()
        if records:
            self._buffer.remember(meeting_id, records[-1].seq)
        return records

    async def set_speakers(self, meeting_id: str, speakers: Mapping[str, str]) -> None:
        if not speakers:
            return
        src = self._keys.meeting(meeting_id)[2]
        try:  # the source hash carries the meeting's TTL; HSET keeps it
            await write_speakers(self._redis, src, speakers)
        except UNREACHABLE as exc:
            raise self._link.unavailable(exc, "store speaker labels") from exc
        self._link.note_success()

    async def last_seq(self, meeting_id: str) -> int:
        log = self._keys.meeting(meeting_id)[1]
        await self._wait_drained(meeting_id)
        try:
            top: Any = await self._redis.xrevrange(log, count=1)
        except UNREACHABLE as exc:
            raise self._link.unavailable(exc, "read the last seq") from exc
        self._link.note_success()
        seq = int(top[0][0].split(b"-", 1)[0]) if top else 0
        if seq:
            self._buffer.remember(meeting_id, seq)
        return max(seq, self._seqs.last(meeting_id) or 0)

    # -- events

    async def publish(self, meeting_id: str, event: bytes) -> None:
        await self._events.publish(meeting_id, event)

    def subscribe(
        self, meeting_id: str
    ) -> contextlib.AbstractAsyncContextManager[AsyncIterator[bytes]]:
        return self._events.subscribe(meeting_id)

    # -- lifecycle

    def held(self) -> dict[str, int]:
        """Per-meeting state held now (all 0 once every meeting ended): a leak check's."""
        held = {"locks": len(self._locks), "buffered meetings": self._buffer.meetings}
        return held | {f"pub/sub {k}": n for k, n in self._events.held().items()}

    @property
    def failures(self) -> int:
        return self._link.failures

    async def health(self) -> StoreHealth:
        if (reason := self._buffer.degraded()) is not None:
            return StoreHealth(self.backend, ok=False, reason=reason, buffered=len(self._buffer))
        try:
            await self.ping()
        except StoreUnavailable as exc:
            return StoreHealth(self.backend, ok=False, reason=str(exc))
        return StoreHealth(self.backend, ok=True)

    async def ping(self) -> None:
        try:
            await self._redis.ping()
        except UNREACHABLE as exc:
            raise self._link.unavailable(exc, "ping") from exc
        self._link.note_success()

    async def close(self, *, drain_timeout: float = 5.0) -> None:
        """Give buffered writes `drain_timeout` to reach Redis, then close everything."""
        if self._closed:
            return
        if self._buffer and not await self.flushed(drain_timeout):
            logger.error(
                "closing the store with %d writes still buffered: they are lost",
                len(self._buffer),
            )
        self._closed = True
        await self._buffer.stop()
        await self.quotas.close()
        await self._events.close()
        if self._owns_client:
            await close_client(self._redis)
