"""`RedisStore`: the `Store` semantics on Redis, shared by every server process.

Every write is one Lua script (one round trip): the final, its `seq`, the source's state
and the TTL refresh of all the meeting's keys land together or not at all. Live events go
through Redis pub/sub on one shared connection per process.

When Redis cannot be reached, finals (and new sources of meetings this node already
serves) go into a bounded in-process buffer with a provisional `seq` taken from the last
`seq` this node knows; a background task replays the buffer in order once Redis answers.
The replay script keeps the provisional `seq` unless Redis already holds a higher one
(another node wrote the meeting meanwhile), in which case the final is re-sequenced after
it: the log stays gap-free and duplicate-free, and a re-sequencing is logged. docs/store.md
spells out the trade-off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from session.store import (
    DEFAULT_BUFFER_LIMIT,
    DEFAULT_PREFIX,
    SUBSCRIBER_QUEUE,
    FinalRecord,
    Listener,
    NewFinal,
    ResumeTokenMismatch,
    SourceState,
    SourceSuperseded,
    StoreHealth,
    StoreOverloaded,
    StoreUnavailable,
    SubscriptionLost,
    UnknownResumeToken,
    check_append,
    hash_token,
    new_source_ids,
)
from session.ttl import Clock, TTLSettings, draw_jitter, system_clock
from wire.query import validate_id

logger = logging.getLogger(__name__)

# Errors after which Redis is treated as unreachable (the write is buffered). Python's
# TimeoutError is an OSError; a READONLY reply means we talk to a replica mid-failover.
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError, ReadOnlyError)

SEQ_CACHE = 100_000  # meetings whose last seq this node remembers (LRU)
FINALS_PAGE = 500  # finals per XRANGE when reading a log
MAX_PREFIX = 64


class Keys:
    """Every key and channel name, built from validated ids only.

    {prefix}meeting:{id}:meta    hash: cfg (JSON), act (last write, epoch s), acc (accesses)
    {prefix}meeting:{id}:log     stream of finals, entry id "{seq}-0", field f = JSON
    {prefix}meeting:{id}:src     hash: s:{sid} state JSON, g:{sid} generation,
                                 u:{utterance id} → its seq (idempotent appends),
                                 sp:{utterance id} → its speaker after a relabel,
                                 t:{sha256(token)} → sid
    {prefix}meeting:{id}:events  pub/sub channel (not a key)
    {prefix}token:{sha256}       meeting id of a token: a hint to tell "another meeting"
                                 from "unknown"
    """

    def __init__(self, prefix: str) -> None:
        if not prefix or len(prefix) > MAX_PREFIX or any(c.isspace() for c in prefix):
            raise ValueError(f"key prefix must be 1-{MAX_PREFIX} characters without spaces")
        self.prefix = prefix

    def meeting(self, meeting_id: str) -> list[str]:
        """[meta, log, src]: the keys every meeting script takes as KEYS[1..3]."""
        base = f"{self.prefix}meeting:{validate_id('meeting_id', meeting_id)}:"
        return [base + "meta", base + "log", base + "src"]

    def events(self, meeting_id: str) -> bytes:
        return f"{self.prefix}meeting:{validate_id('meeting_id', meeting_id)}:events".encode()

    def token(self, digest: str) -> str:
        return f"{self.prefix}token:{digest}"


# ---------------------------------------------------------------- Lua

# ARGV[1] now (epoch s, from the injected clock), ARGV[2] jitter u in [-1, 1],
# ARGV[3..8] TTLSettings.lua_args(); KEYS[1..3] meta, log, src. The TTL arithmetic is
# session.ttl.ttl_ms, in the same order.
_LUA_COMMON = """
local now = tonumber(ARGV[1])
local u = tonumber(ARGV[2])
local function ttl_for(idle)
  local acc = redis.call('HINCRBY', KEYS[1], 'acc', 1)
  local t = math.floor(tonumber(ARGV[3]) * math.max(tonumber(ARGV[4]), 1 - idle / tonumber(ARGV[5]))
    * math.min(tonumber(ARGV[7]), 1 + tonumber(ARGV[6]) * acc) * (1 + tonumber(ARGV[8]) * u))
  if t < 1000 then t = 1000 end
  return t
end
local function set_ttl(t)
  for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], t) end
end
local function extend_ttl(t)
  for i = 1, 3 do
    local cur = redis.call('PTTL', KEYS[i])
    if cur >= 0 and cur < t then redis.call('PEXPIRE', KEYS[i], t) end
  end
end
local function last_seq()
  local top = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
  if top[1] then return tonumber(string.match(top[1][1], '^(%d+)')) end
  return 0
end
"""

# KEYS[4] token hint. ARGV[9] sid, [10] token hash, [11] state JSON, [12] config JSON or '',
# [13] meeting id, [14] hint TTL ms. Returns the meeting's last seq.
_LUA_CREATE = (
    _LUA_COMMON
    + """
if ARGV[12] ~= '' then redis.call('HSETNX', KEYS[1], 'cfg', ARGV[12]) end
redis.call('HSET', KEYS[1], 'act', ARGV[1])
redis.call('HSET', KEYS[3], 's:' .. ARGV[9], ARGV[11], 't:' .. ARGV[10], ARGV[9])
redis.call('HSETNX', KEYS[3], 'g:' .. ARGV[9], 1)
set_ttl(ttl_for(0))
redis.call('SET', KEYS[4], ARGV[13], 'PX', ARGV[14])
return last_seq()
"""
)

# ARGV[9] sid, [10] utterance id, [11] final JSON, [12] state JSON, [13] generation,
# [14] lowest acceptable seq (the provisional one on replay; 0 for none), [15] '1' on replay.
# Returns {1, seq} appended, {2, seq} already logged (same utterance id), {3, generation}
# superseded. A replayed final is logged even if its source was resumed meanwhile (finals
# are never dropped), but then it does not overwrite the newer session's source state.
_LUA_APPEND = (
    _LUA_COMMON
    + """
local sid = ARGV[9]
local logged = redis.call('HGET', KEYS[3], 'u:' .. ARGV[10])
if logged then return {2, tonumber(logged)} end
local gen = tonumber(ARGV[13])
local stored = tonumber(redis.call('HGET', KEYS[3], 'g:' .. sid) or '0')
if stored > gen and ARGV[15] ~= '1' then return {3, stored} end
local seq = last_seq() + 1
local lowest = tonumber(ARGV[14])
if lowest > seq then seq = lowest end
redis.call('XADD', KEYS[2], seq .. '-0', 'f', ARGV[11])
redis.call('HSET', KEYS[3], 'u:' .. ARGV[10], seq)
if stored <= gen then redis.call('HSET', KEYS[3], 's:' .. sid, ARGV[12], 'g:' .. sid, gen) end
redis.call('HSET', KEYS[1], 'act', ARGV[1])
set_ttl(ttl_for(0))
return {1, seq}
"""
)

# A read (finals): counts as an access and may only extend the TTL. Returns 0 if the
# meeting does not exist. The log itself is read with plain XRANGE pages: returning it
# from Lua costs Redis 8-15x more time (25 ms for 2000 finals, blocking every room).
_LUA_TOUCH = (
    _LUA_COMMON
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local act = tonumber(redis.call('HGET', KEYS[1], 'act') or ARGV[1])
extend_ttl(ttl_for(math.max(0, now - act)))
return 1
"""
)

# KEYS[4] token hint. ARGV[9] token hash, [10] participant or '', [11] hint TTL ms.
# Returns {0, hint meeting or nil} unknown here, {2, participant} wrong participant,
# {1, sid, state JSON, generation, last seq} resumed.
_LUA_RESUME = (
    _LUA_COMMON
    + """
local sid = redis.call('HGET', KEYS[3], 't:' .. ARGV[9])
local state = sid and redis.call('HGET', KEYS[3], 's:' .. sid)
if not state then return {0, redis.call('GET', KEYS[4])} end
if ARGV[10] ~= '' then
  local who = cjson.decode(state)['participant']
  if who ~= ARGV[10] then return {2, who} end
end
local gen = redis.call('HINCRBY', KEYS[3], 'g:' .. sid, 1)
redis.call('HSET', KEYS[1], 'act', ARGV[1])
set_ttl(ttl_for(0))
redis.call('PEXPIRE', KEYS[4], ARGV[11])
return {1, sid, state, gen, last_seq()}
"""
)

_APPENDED, _DUPLICATE, _SUPERSEDED = 1, 2, 3


# ---------------------------------------------------------------- write buffer


@dataclass(frozen=True, slots=True)
class _PendingFinal:
    meeting_id: str
    record: FinalRecord  # carries the provisional seq the caller was given
    source: SourceState
    now: float


@dataclass(frozen=True, slots=True)
class _PendingSource:
    meeting_id: str
    state: SourceState
    digest: str
    config: bytes
    now: float


_Pending = _PendingFinal | _PendingSource


def _log_crash(task: asyncio.Task[None]) -> None:
    """A background task of the store died of a bug: say so loudly, with the traceback."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        logger.error("store task %s crashed", task.get_name(), exc_info=exc)


class _KeyedLocks:
    """One asyncio.Lock per key, dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    @contextlib.asynccontextmanager
    async def __call__(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.setdefault(key, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._locks[key]


# ---------------------------------------------------------------- store


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
    ) -> None:
        if buffer_limit < 2:
            raise ValueError("buffer_limit must be >= 2")
        self._redis = redis
        self._keys = Keys(prefix)
        self._ttl = ttl or TTLSettings()
        self._ttl_args = self._ttl.lua_args()
        self._hint_ttl_ms = str(self._ttl.max_ttl_ms)
        self._clock = clock
        self._rng = rng or random.Random()
        self._subscriber_queue = subscriber_queue
        self._read_wait_s = read_wait_s
        self._retry_delays = retry_delays
        self._owns_client = owns_client
        self._create = redis.register_script(_LUA_CREATE)
        self._append = redis.register_script(_LUA_APPEND)
        self._touch = redis.register_script(_LUA_TOUCH)
        self._resume = redis.register_script(_LUA_RESUME)
        self._locks = _KeyedLocks()
        self._seqs: OrderedDict[str, int] = OrderedDict()  # last seq known per meeting
        self._uncertain: set[str] = set()  # meetings whose last append was cut short
        # write buffer
        self.buffer_limit = buffer_limit
        self._buffer: deque[_Pending] = deque()
        self._buffered_per_meeting: dict[str, int] = {}
        self._drained = asyncio.Event()
        self._drained.set()
        self._flusher: asyncio.Task[None] | None = None
        self._failing = False  # the last call to Redis failed
        self._last_error = ""
        self.resequenced = 0  # buffered finals whose provisional seq had to change
        # pub/sub
        self._pubsub: PubSub | None = None
        self._pool_retry: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._channels: dict[bytes, set[Listener]] = {}
        self._confirm: dict[bytes, asyncio.Future[None]] = {}
        self._sub_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        socket_timeout: float = 1.0,
        connect_timeout: float = 0.5,
        **options: Any,
    ) -> RedisStore:
        """A store on its own connection pool. Redis' own retries are reduced to one
        immediate reconnect: the write buffer, not a blocked caller, rides out outages."""
        redis = Redis.from_url(
            url,
            decode_responses=False,
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
            retry=Retry(NoBackoff(), 1),
        )
        return cls(redis, prefix=prefix, owns_client=True, **options)

    # -- small helpers

    def _ttl_argv(self, now: float) -> list[str]:
        return [repr(now), repr(draw_jitter(self._rng)), *self._ttl_args]

    def _remember_seq(self, meeting_id: str, seq: int, *, stored: bool = False) -> None:
        """Note a seq given in the meeting. `stored`: it is Redis' last seq, read under the
        meeting's lock with nothing of the meeting buffered, so it replaces what we had
        (a meeting id reused after expiry starts again at 1)."""
        if seq > self._seqs.get(meeting_id, -1) or (
            stored and not self._buffered_per_meeting.get(meeting_id)
        ):
            self._seqs[meeting_id] = seq
        self._uncertain.discard(meeting_id)  # any seq from Redis settles the doubt
        self._seqs.move_to_end(meeting_id)
        if len(self._seqs) > SEQ_CACHE:
            self._seqs.popitem(last=False)

    def _note_failure(self, exc: BaseException) -> None:
        if not self._failing:
            logger.warning("redis unreachable: %s", exc)
        self._failing = True
        self._last_error = f"{type(exc).__name__}: {exc}"

    def _note_success(self) -> None:
        if self._failing:
            logger.warning("redis reachable again")
        self._failing = False

    def _unavailable(self, exc: BaseException, what: str) -> StoreUnavailable:
        self._note_failure(exc)
        return StoreUnavailable(f"redis unreachable ({self._last_error}): cannot {what}")

    async def _wait_drained(self, meeting_id: str) -> None:
        """Reads of a meeting wait until its buffered writes are in Redis."""
        if not self._buffered_per_meeting.get(meeting_id):
            return
        try:
            await asyncio.wait_for(self._drained.wait(), self._read_wait_s)
        except TimeoutError:
            count = self._buffered_per_meeting.get(meeting_id, 0)
            raise StoreUnavailable(
                f"redis unreachable ({self._last_error}): {count} writes of this meeting "
                "are still buffered"
            ) from None

    def _check_admission(self) -> None:
        """New and resumed sessions get half the buffer, so live ones keep room."""
        if len(self._buffer) >= self.buffer_limit // 2:
            raise StoreOverloaded(
                f"store write buffer holds {len(self._buffer)} of {self.buffer_limit} writes "
                f"while redis is unreachable ({self._last_error}): not admitting new sessions"
            )

    # -- sources

    async def create_source(
        self, meeting_id: str, participant: str, config: Mapping[str, Any] | None = None
    ) -> tuple[SourceState, str]:
        keys = self._keys.meeting(meeting_id)
        validate_id("participant", participant)
        session_id, token = new_source_ids()
        state = SourceState(meeting_id=meeting_id, session_id=session_id, participant=participant)
        pending = _PendingSource(
            meeting_id=meeting_id,
            state=state,
            digest=hash_token(token),
            config=orjson.dumps(dict(config)) if config is not None else b"",
            now=self._clock(),
        )
        async with self._locks(meeting_id):
            self._check_admission()
            if not self._buffer:
                try:
                    last = await self._apply_source(pending, keys)
                except UNREACHABLE as exc:
                    self._note_failure(exc)
                else:
                    self._note_success()
                    self._remember_seq(meeting_id, last, stored=True)
                    return state, token
            if meeting_id not in self._seqs or meeting_id in self._uncertain:
                raise StoreUnavailable(
                    f"redis unreachable ({self._last_error}): cannot open meeting "
                    f"{meeting_id!r}, whose last seq this node does not know for sure"
                )
            self._enqueue(pending)
            return state, token

    async def _apply_source(self, pending: _PendingSource, keys: list[str]) -> int:
        state = pending.state
        result = await self._create(
            keys=[*keys, self._keys.token(pending.digest)],
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
            self._check_admission()
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
                raise self._unavailable(exc, "resume a session") from exc
            if int(result[0]) == 1:
                self._remember_seq(meeting_id, int(result[4]), stored=True)
        self._note_success()
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
            raise self._unavailable(exc, "read the meeting config") from exc
        self._note_success()
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
                lowest = self._seqs[meeting_id] + 1 if meeting_id in self._seqs else 0
                try:
                    status, seq = await self._apply_final(
                        meeting_id, final, source, now, lowest, replay=False
                    )
                except UNREACHABLE as exc:
                    self._note_failure(exc)
                except asyncio.CancelledError:
                    # Redis may have logged it: until Redis tells us the meeting's last seq
                    # again, this node must not hand out provisional seqs for it.
                    self._uncertain.add(meeting_id)
                    raise
                else:
                    self._note_success()
                    if status == _SUPERSEDED:
                        raise SourceSuperseded(
                            f"source {source.session_id} was resumed by another session"
                        )
                    self._remember_seq(meeting_id, seq)
                    return FinalRecord.from_new(seq, final)
            return self._buffer_final(meeting_id, final, source, now)

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

    def _buffer_final(
        self, meeting_id: str, final: NewFinal, source: SourceState, now: float
    ) -> FinalRecord:
        if len(self._buffer) >= self.buffer_limit:
            raise StoreOverloaded(
                f"store write buffer is full ({self.buffer_limit} writes) while redis is "
                f"unreachable ({self._last_error}): this final was not logged"
            )
        if meeting_id not in self._seqs or meeting_id in self._uncertain:
            raise StoreUnavailable(
                f"redis unreachable ({self._last_error}) and the last seq of meeting "
                f"{meeting_id!r} is not known for sure on this node"
            )
        record = FinalRecord.from_new(self._seqs[meeting_id] + 1, final)
        self._remember_seq(meeting_id, record.seq)
        self._enqueue(_PendingFinal(meeting_id, record, source, now))
        return record

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
            records = await self._relabelled(keys[2], records)
        except UNREACHABLE as exc:
            raise self._unavailable(exc, "read the transcript") from exc
        self._note_success()
        if records:
            self._remember_seq(meeting_id, records[-1].seq)
        return records

    async def _relabelled(self, src: str, records: list[FinalRecord]) -> list[FinalRecord]:
        """Apply the speakers re-clustering gave to diarized finals after they were logged."""
        diarized = [r for r in records if r.speaker is not None]
        if not diarized:
            return records
        labels: Any = await self._redis.hmget(src, [f"sp:{r.utterance_id}" for r in diarized])
        changed = {
            r.utterance_id: label.decode()
            for r, label in zip(diarized, labels, strict=True)
            if label is not None and label.decode() != r.speaker
        }
        if not changed:
            return records
        return [
            replace(r, speaker=changed[r.utterance_id]) if r.utterance_id in changed else r
            for r in records
        ]

    async def set_speakers(self, meeting_id: str, speakers: Mapping[str, str]) -> None:
        if not speakers:
            return
        src = self._keys.meeting(meeting_id)[2]
        try:  # the source hash carries the meeting's TTL; HSET keeps it
            await self._redis.hset(src, mapping={f"sp:{k}": v for k, v in speakers.items()})
        except UNREACHABLE as exc:
            raise self._unavailable(exc, "store speaker labels") from exc
        self._note_success()

    async def last_seq(self, meeting_id: str) -> int:
        log = self._keys.meeting(meeting_id)[1]
        await self._wait_drained(meeting_id)
        try:
            top: Any = await self._redis.xrevrange(log, count=1)
        except UNREACHABLE as exc:
            raise self._unavailable(exc, "read the last seq") from exc
        self._note_success()
        seq = int(top[0][0].split(b"-", 1)[0]) if top else 0
        if seq:
            self._remember_seq(meeting_id, seq)
        return max(seq, self._seqs.get(meeting_id, 0))

    # -- write buffer

    def _enqueue(self, pending: _Pending) -> None:
        self._buffer.append(pending)
        count = self._buffered_per_meeting.get(pending.meeting_id, 0)
        self._buffered_per_meeting[pending.meeting_id] = count + 1
        self._drained.clear()
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(
                self._flush(), name="parley-store-flush"
            )
            self._flusher.add_done_callback(_log_crash)

    async def _flush(self) -> None:
        """Replay the buffer in order until it is empty, backing off while Redis is away."""
        low, high = self._retry_delays
        delay = low
        while self._buffer:
            pending = self._buffer[0]
            try:
                await self._replay(pending)
            except UNREACHABLE as exc:
                self._note_failure(exc)
            except RedisError:
                # e.g. OOM or a script error: keep the write, say why, try again later
                logger.exception("replaying a buffered write failed; will retry")
                self._failing = True
                self._last_error = "replay failed (see log)"
            else:
                self._note_success()
                self._buffer.popleft()
                count = self._buffered_per_meeting[pending.meeting_id] - 1
                if count:
                    self._buffered_per_meeting[pending.meeting_id] = count
                else:
                    del self._buffered_per_meeting[pending.meeting_id]
                delay = low
                continue
            await asyncio.sleep(delay)
            delay = min(high, delay * 2)
        self._drained.set()

    async def _replay(self, pending: _Pending) -> None:
        keys = self._keys.meeting(pending.meeting_id)
        if isinstance(pending, _PendingSource):
            self._remember_seq(pending.meeting_id, await self._apply_source(pending, keys))
            return
        record = pending.record
        final = NewFinal(**{k: v for k, v in record.as_dict().items() if k != "seq"})
        _, value = await self._apply_final(
            pending.meeting_id, final, pending.source, pending.now, record.seq, replay=True
        )
        if value != record.seq:
            self.resequenced += 1
            logger.warning(
                "buffered final %s of meeting %s logged as seq %d, not provisional seq %d "
                "(another node wrote the meeting while redis was unreachable)",
                record.utterance_id,
                pending.meeting_id,
                value,
                record.seq,
            )
        self._remember_seq(pending.meeting_id, value)

    async def flushed(self, within_s: float) -> bool:
        """Wait until the write buffer is empty; False if it is not within `within_s`."""
        try:
            await asyncio.wait_for(self._drained.wait(), within_s)
        except TimeoutError:
            return False
        return True

    # -- events

    async def publish(self, meeting_id: str, event: bytes) -> None:
        channel = self._keys.events(meeting_id)
        try:
            await self._redis.publish(channel, event)
        except UNREACHABLE as exc:
            # Live events are not buffered: listeners lost the connection too and will
            # catch up from the log once they reconnect.
            self._note_failure(exc)

    @contextlib.asynccontextmanager
    async def subscribe(self, meeting_id: str) -> AsyncIterator[AsyncIterator[bytes]]:
        channel = self._keys.events(meeting_id)
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
                raise self._unavailable(exc, "subscribe to the meeting's events") from exc
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
            pubsub = self._redis.pubsub()
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
            self._reader.add_done_callback(_log_crash)
        return self._pubsub

    async def _read(self, pubsub: PubSub) -> None:
        why = "the subscription reader stopped"
        try:
            while True:
                message = await pubsub.get_message(timeout=None)
                if message is None:
                    continue
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
            self._note_failure(exc)
            why = f"redis unreachable ({self._last_error})"
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
            await pubsub.aclose()  # type: ignore[no-untyped-call]
        if connection is not None and self._pool_retry is not None:
            connection.retry = self._pool_retry  # back in the pool: the pool's policy

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- lifecycle

    async def health(self) -> StoreHealth:
        buffered = len(self._buffer)
        if buffered >= self.buffer_limit // 2:
            reason = (
                f"write buffer at {buffered} of {self.buffer_limit}: refusing new sessions; "
                f"redis: {self._last_error or 'catching up'}"
            )
            return StoreHealth(self.backend, ok=False, reason=reason, buffered=buffered)
        if buffered:
            state = f"unreachable ({self._last_error})" if self._failing else "catching up"
            reason = f"redis {state}: {buffered} writes buffered, replaying in order"
            return StoreHealth(self.backend, ok=False, reason=reason, buffered=buffered)
        try:
            await self.ping()
        except StoreUnavailable as exc:
            return StoreHealth(self.backend, ok=False, reason=str(exc))
        return StoreHealth(self.backend, ok=True)

    async def ping(self) -> None:
        try:
            await self._redis.ping()
        except UNREACHABLE as exc:
            raise self._unavailable(exc, "ping") from exc
        self._note_success()

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
        tasks = [t for t in (self._flusher, self._reader, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for listeners in self._channels.values():
            for listener in listeners:
                listener.drop(SubscriptionLost("the store was closed"))
        self._channels.clear()
        if self._pubsub is not None:
            await self._close_pubsub(self._pubsub)
            self._pubsub = None
        if self._owns_client:
            await self._redis.aclose()
