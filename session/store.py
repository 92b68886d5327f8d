"""Meeting context: config, audio sources (for resume), the finals log with its gap-free
`seq`, and live event fan-out.

`Store` is the interface the sessions and routes use. `MemoryStore` is the embedded
single-node default; `RedisStore` (session/redis_store.py) keeps the same semantics across
processes. `open_store()` picks one. docs/store.md describes keys, TTLs and faults.

Exceptions (what the server does with them in brackets):

    StoreError
    ├── StoreUnavailable         the store cannot be reached and this call cannot be
    │                            buffered (new session: 1013; transcript GET: 503)
    ├── StoreOverloaded          the write buffer is at its bound (new session: 1013;
    │                            an append: end the session with 1013, the client resumes)
    ├── SourceSuperseded         the source was resumed by another session: stop this one
    ├── ResumeRefused
    │   ├── UnknownResumeToken   no such token: expired or never issued (4404)
    │   └── ResumeTokenMismatch  the token belongs to another meeting or participant (4403)
    └── SubscriberLagged         a listener was dropped; it reconnects and catches up
        └── SubscriptionLost     ... because the store connection under it broke or closed
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import re
import secrets
from collections.abc import AsyncIterator, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Protocol

from session.ttl import Clock, TTLSettings, draw_jitter, system_clock, ttl_ms
from wire.messages import Final, Word
from wire.query import validate_id

SUBSCRIBER_QUEUE = 256  # events buffered per listener before it is judged too slow
DEFAULT_PREFIX = "parley:"
DEFAULT_BUFFER_LIMIT = 10_000  # finals held in memory while Redis is unreachable

_TOKEN_PATTERN = re.compile(r"[A-Za-z0-9_-]{16,128}")  # fullmatch: "$" takes a "\n"


# ---------------------------------------------------------------- errors


class StoreError(Exception):
    """Base of every error the store raises on purpose."""


class StoreUnavailable(StoreError):
    """The store cannot be reached and the call cannot be served from the write buffer."""


class StoreOverloaded(StoreError):
    """The write buffer is full (or too full to admit a new session)."""


class SourceSuperseded(StoreError):
    """Another session resumed this source; appends from the older one are refused."""


class ResumeRefused(StoreError):
    """A resume token that cannot resume this source."""


class UnknownResumeToken(ResumeRefused):
    """No such token in this meeting: never issued, malformed, or expired with its meeting."""


class ResumeTokenMismatch(ResumeRefused):
    """The token is bound to another meeting or another participant."""


class SubscriberLagged(StoreError):
    """A listener fell more than SUBSCRIBER_QUEUE events behind and was dropped."""


class SubscriptionLost(SubscriberLagged):
    """The store connection under a listener broke (or the store closed): events may be
    missing, so the listener is dropped like a lagging one."""


# ---------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class NewFinal:
    """A final transcript before the store has given it its `seq`."""

    utterance_id: str
    session_id: str
    participant: str
    text: str
    start: float
    end: float
    language: str
    words: list[Word] = field(default_factory=list)
    speaker: str | None = None  # diarized sources only


@dataclass(frozen=True, slots=True, kw_only=True)
class FinalRecord(Final):
    """A final as logged: the protocol's final and the session that spoke it."""

    session_id: str

    @classmethod
    def from_new(cls, seq: int, final: NewFinal) -> FinalRecord:
        # field by field, not asdict(): no deep copy of the words on every final
        return cls(seq=seq, **{f.name: getattr(final, f.name) for f in fields(NewFinal)})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FinalRecord:
        return cls(**data)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class SourceState:
    """What a resumed source needs, as of its last logged final.

    The session actor keeps the current state and passes the *next* one with every final
    (`replace(state, acked_until=final.end, next_utterance=..., context=...)`); the store
    writes it in the same atomic step as the final, so it always agrees with the log.
    """

    meeting_id: str
    session_id: str
    participant: str
    generation: int = 1  # raised by every resume; appends carrying an older one are refused
    acked_until: float = 0.0  # end (s, this source's audio) of its last logged final
    next_utterance: int = 0  # index of this source's next utterance
    context: str = ""  # rolling text context: the model's prompt
    language: str | None = None  # the stream's language once pinned (given or detected)

    def stored(self) -> dict[str, Any]:
        """The fields persisted as the source's state (generation is kept apart)."""
        return {
            "participant": self.participant,
            "acked_until": self.acked_until,
            "next_utterance": self.next_utterance,
            "context": self.context,
            "language": self.language,
        }

    @classmethod
    def from_stored(
        cls, meeting_id: str, session_id: str, generation: int, data: dict[str, Any]
    ) -> SourceState:
        return cls(
            meeting_id=meeting_id,
            session_id=session_id,
            participant=data["participant"],
            generation=generation,
            acked_until=float(data["acked_until"]),
            next_utterance=int(data["next_utterance"]),
            context=data["context"],
            language=data.get("language"),  # absent in state written before it was kept
        )


@dataclass(frozen=True, slots=True)
class StoreHealth:
    """For /readyz: `ok` False means degraded; `reason` says why in words."""

    backend: str
    ok: bool
    reason: str = ""
    buffered: int = 0  # writes waiting in memory for the store

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------- interface


class Store(Protocol):
    async def create_source(
        self, meeting_id: str, participant: str, config: Mapping[str, Any] | None = None
    ) -> tuple[SourceState, str]:
        """Register a new audio source of the meeting and return its initial state and its
        resume token. The meeting is created if new; `config` becomes the meeting's config
        if it has none yet (first writer wins). Raises StoreOverloaded or StoreUnavailable
        when the session should be refused."""
        ...

    async def resume_source(
        self, meeting_id: str, token: str, participant: str | None = None
    ) -> SourceState:
        """The state of the source the token was issued for, with a new `generation`: from
        now on appends carrying an older generation raise SourceSuperseded. `participant`,
        when given, must be the token's. Raises UnknownResumeToken or ResumeTokenMismatch."""
        ...

    async def meeting_config(self, meeting_id: str) -> dict[str, Any] | None:
        """The config the meeting was created with, None if the meeting does not exist."""
        ...

    async def append_final(
        self, meeting_id: str, final: NewFinal, source: SourceState
    ) -> FinalRecord:
        """In one atomic write: give the final the meeting's next `seq`, append it to the
        log, store `source` as its source's state and refresh the meeting's TTL.
        Appending an `utterance_id` already in the meeting's log returns its logged `seq`
        and writes nothing (utterance ids are unique per meeting: `{session_id}-{index}`).
        Raises SourceSuperseded if the source was resumed since `source` was read;
        StoreOverloaded (buffer full) or StoreUnavailable (this node cannot number the
        final safely) while the store is unreachable: the final is then NOT logged, so
        end the session with 1013 and let the client resume from `acked_until`."""
        ...

    async def finals(self, meeting_id: str, after_seq: int = 0) -> list[FinalRecord]:
        """The meeting's finals with `seq` > after_seq, in `seq` order (with their latest
        speaker labels)."""
        ...

    async def set_speakers(self, meeting_id: str, speakers: Mapping[str, str]) -> None:
        """Relabel logged finals: utterance id → speaker. Ids not (yet) in the log are kept
        and apply when the final arrives. Raises StoreUnavailable when unreachable."""
        ...

    async def last_seq(self, meeting_id: str) -> int:
        """The highest `seq` given in the meeting so far, 0 if none."""
        ...

    async def publish(self, meeting_id: str, event: bytes) -> None:
        """Send one encoded server message to every listener of the meeting (best effort:
        live events are not buffered while the store is unreachable)."""
        ...

    def subscribe(
        self, meeting_id: str
    ) -> contextlib.AbstractAsyncContextManager[AsyncIterator[bytes]]:
        """Listen to the meeting's events from now on. The iterator raises SubscriberLagged
        if the listener falls too far behind or loses the store."""
        ...

    async def health(self) -> StoreHealth:
        """ok, or degraded with a reason (unreachable, catching up, buffer full)."""
        ...

    async def ping(self) -> None:
        """Raise StoreUnavailable if the store cannot be reached."""
        ...

    async def close(self) -> None: ...


# ---------------------------------------------------------------- shared helpers


def hash_token(token: str) -> str:
    """The stored form of a resume token. A malformed token is simply unknown."""
    if not _TOKEN_PATTERN.fullmatch(token):
        raise UnknownResumeToken("malformed resume token")
    return hashlib.sha256(token.encode()).hexdigest()


def new_source_ids() -> tuple[str, str]:
    """A fresh (session_id, resume_token). The token carries 256 random bits."""
    return secrets.token_hex(8), secrets.token_urlsafe(32)


def check_append(meeting_id: str, final: NewFinal, source: SourceState) -> None:
    """The final and the source state must describe the same source of this meeting."""
    validate_id("meeting_id", meeting_id)
    validate_id("session_id", source.session_id)
    if source.meeting_id != meeting_id:
        raise ValueError(f"source of meeting {source.meeting_id!r} used in {meeting_id!r}")
    if final.session_id != source.session_id or final.participant != source.participant:
        raise ValueError("final and source state belong to different sources")


class Listener:
    """One listener's bounded queue. A full queue drops the listener, never the publisher."""

    def __init__(self, maxsize: int = SUBSCRIBER_QUEUE) -> None:
        self._queue: asyncio.Queue[bytes | StoreError] = asyncio.Queue(maxsize)
        self.dropped = False

    def offer(self, event: bytes) -> bool:
        """Queue one event; False once the listener is dropped (now or before)."""
        if self.dropped:
            return False
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self.drop(SubscriberLagged("listener fell too far behind and was dropped"))
            return False
        return True

    def drop(self, error: StoreError) -> None:
        """Discard what is queued and make the iterator raise `error` next."""
        if self.dropped:
            return
        self.dropped = True
        while not self._queue.empty():
            self._queue.get_nowait()
        self._queue.put_nowait(error)

    async def events(self) -> AsyncIterator[bytes]:
        while True:
            item = await self._queue.get()
            if isinstance(item, StoreError):
                raise item
            yield item


# ---------------------------------------------------------------- memory


@dataclass
class _Meeting:
    config: dict[str, Any] | None = None
    finals: list[FinalRecord] = field(default_factory=list)
    sources: dict[str, SourceState] = field(default_factory=dict)
    logged: dict[str, int] = field(default_factory=dict)  # utterance id → seq
    speakers: dict[str, str] = field(default_factory=dict)  # utterance id → relabelled speaker
    tokens: dict[str, str] = field(default_factory=dict)  # token hash → session id
    accesses: int = 0
    last_write: float = 0.0
    expires_at: float = 0.0


class MemoryStore:
    """In-process store for a single node, with the same TTL policy as Redis (driven by
    the injected clock). Everything is lost when the process exits."""

    backend = "memory"
    SWEEP_EVERY_S = 60.0

    def __init__(
        self,
        *,
        ttl: TTLSettings | None = None,
        clock: Clock = system_clock,
        rng: random.Random | None = None,
        subscriber_queue: int = SUBSCRIBER_QUEUE,
    ) -> None:
        self._ttl = ttl or TTLSettings()
        self._clock = clock
        self._rng = rng or random.Random()
        self._subscriber_queue = subscriber_queue
        self._meetings: dict[str, _Meeting] = {}
        self._token_hints: dict[str, tuple[str, float]] = {}  # hash → (meeting, expires_at)
        self._listeners: dict[str, set[Listener]] = {}
        self._next_sweep = clock() + self.SWEEP_EVERY_S

    # -- TTL

    def _live(self, meeting_id: str) -> _Meeting | None:
        meeting = self._meetings.get(meeting_id)
        if meeting is not None and meeting.expires_at <= self._clock():
            del self._meetings[meeting_id]
            return None
        return meeting

    def _touch(self, meeting: _Meeting, *, write: bool) -> None:
        now = self._clock()
        meeting.accesses += 1
        idle = 0.0 if write else max(0.0, now - meeting.last_write)
        ttl = ttl_ms(self._ttl, idle_s=idle, accesses=meeting.accesses, u=draw_jitter(self._rng))
        expires_at = now + ttl / 1000.0
        if write:
            meeting.last_write = now
            meeting.expires_at = expires_at
        else:
            meeting.expires_at = max(meeting.expires_at, expires_at)
        if now >= self._next_sweep:
            self._sweep(now)

    def _sweep(self, now: float) -> None:
        self._next_sweep = now + self.SWEEP_EVERY_S
        for meeting_id in [m for m, v in self._meetings.items() if v.expires_at <= now]:
            del self._meetings[meeting_id]
        for digest in [t for t, (_, exp) in self._token_hints.items() if exp <= now]:
            del self._token_hints[digest]

    def ttl(self, meeting_id: str) -> float | None:
        """Seconds until the meeting expires, None if it does not exist (for tests, ops)."""
        meeting = self._live(meeting_id)
        return None if meeting is None else meeting.expires_at - self._clock()

    # -- sources

    async def create_source(
        self, meeting_id: str, participant: str, config: Mapping[str, Any] | None = None
    ) -> tuple[SourceState, str]:
        validate_id("meeting_id", meeting_id)
        validate_id("participant", participant)
        session_id, token = new_source_ids()
        meeting = self._live(meeting_id)
        if meeting is None:
            meeting = self._meetings[meeting_id] = _Meeting()
        if meeting.config is None and config is not None:
            meeting.config = dict(config)
        state = SourceState(meeting_id=meeting_id, session_id=session_id, participant=participant)
        digest = hash_token(token)
        meeting.sources[session_id] = state
        meeting.tokens[digest] = session_id
        self._touch(meeting, write=True)
        self._token_hints[digest] = (meeting_id, self._clock() + self._ttl.max_ttl_ms / 1000.0)
        return state, token

    async def resume_source(
        self, meeting_id: str, token: str, participant: str | None = None
    ) -> SourceState:
        validate_id("meeting_id", meeting_id)
        if participant is not None:
            validate_id("participant", participant)
        digest = hash_token(token)
        meeting = self._live(meeting_id)
        session_id = None if meeting is None else meeting.tokens.get(digest)
        if meeting is None or session_id is None:
            hint = self._token_hints.get(digest)
            if hint is not None and hint[0] != meeting_id and hint[1] > self._clock():
                raise ResumeTokenMismatch("the resume token belongs to another meeting")
            raise UnknownResumeToken("unknown or expired resume token")
        source = meeting.sources[session_id]
        if participant is not None and participant != source.participant:
            raise ResumeTokenMismatch("the resume token belongs to another participant")
        source = meeting.sources[session_id] = replace(source, generation=source.generation + 1)
        self._touch(meeting, write=True)
        self._token_hints[digest] = (meeting_id, self._clock() + self._ttl.max_ttl_ms / 1000.0)
        return source

    async def meeting_config(self, meeting_id: str) -> dict[str, Any] | None:
        validate_id("meeting_id", meeting_id)
        meeting = self._live(meeting_id)
        if meeting is None:
            return None
        return dict(meeting.config) if meeting.config is not None else {}

    # -- finals

    async def append_final(
        self, meeting_id: str, final: NewFinal, source: SourceState
    ) -> FinalRecord:
        check_append(meeting_id, final, source)
        meeting = self._live(meeting_id)
        if meeting is None:  # expired under a live session: recreate rather than lose finals
            meeting = self._meetings[meeting_id] = _Meeting()
        logged = meeting.logged.get(final.utterance_id)
        if logged is not None:
            return meeting.finals[logged - 1]
        stored = meeting.sources.get(source.session_id)
        if stored is not None and stored.generation > source.generation:
            raise SourceSuperseded(f"source {source.session_id} was resumed by another session")
        seq = meeting.finals[-1].seq + 1 if meeting.finals else 1
        record = FinalRecord.from_new(seq, final)
        if final.utterance_id in meeting.speakers:
            record = replace(record, speaker=meeting.speakers[final.utterance_id])
        meeting.finals.append(record)
        meeting.logged[final.utterance_id] = seq
        meeting.sources[source.session_id] = source
        self._touch(meeting, write=True)
        return record

    async def finals(self, meeting_id: str, after_seq: int = 0) -> list[FinalRecord]:
        validate_id("meeting_id", meeting_id)
        meeting = self._live(meeting_id)
        if meeting is None:
            return []
        self._touch(meeting, write=False)
        return meeting.finals[max(0, after_seq) :]

    async def set_speakers(self, meeting_id: str, speakers: Mapping[str, str]) -> None:
        validate_id("meeting_id", meeting_id)
        meeting = self._live(meeting_id)
        if meeting is None:
            return
        meeting.speakers.update(speakers)
        for utterance_id, speaker in speakers.items():
            seq = meeting.logged.get(utterance_id)
            if seq is not None:
                meeting.finals[seq - 1] = replace(meeting.finals[seq - 1], speaker=speaker)
        self._touch(meeting, write=True)

    async def last_seq(self, meeting_id: str) -> int:
        validate_id("meeting_id", meeting_id)
        meeting = self._live(meeting_id)
        return meeting.finals[-1].seq if meeting is not None and meeting.finals else 0

    # -- events

    async def publish(self, meeting_id: str, event: bytes) -> None:
        listeners = self._listeners.get(meeting_id)
        if not listeners:
            return
        for listener in list(listeners):
            if not listener.offer(event):
                listeners.discard(listener)

    @contextlib.asynccontextmanager
    async def subscribe(self, meeting_id: str) -> AsyncIterator[AsyncIterator[bytes]]:
        validate_id("meeting_id", meeting_id)
        listener = Listener(self._subscriber_queue)
        self._listeners.setdefault(meeting_id, set()).add(listener)
        try:
            yield listener.events()
        finally:
            listeners = self._listeners.get(meeting_id)
            if listeners is not None:
                listeners.discard(listener)
                if not listeners:
                    del self._listeners[meeting_id]

    # -- lifecycle

    async def health(self) -> StoreHealth:
        return StoreHealth(backend=self.backend, ok=True)

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        for listeners in self._listeners.values():
            for listener in listeners:
                listener.drop(SubscriptionLost("the store was closed"))
        self._listeners.clear()


def open_store(
    redis_url: str | None,
    *,
    prefix: str = DEFAULT_PREFIX,
    ttl: TTLSettings | None = None,
    clock: Clock = system_clock,
    rng: random.Random | None = None,
    buffer_limit: int = DEFAULT_BUFFER_LIMIT,
) -> Store:
    """The store the settings ask for: Redis when `redis_url` (PARLEY_REDIS_URL) is set,
    else the in-process MemoryStore. Opening connects nothing; call `ping()` to check."""
    if not redis_url:
        return MemoryStore(ttl=ttl, clock=clock, rng=rng)
    from session.redis_store import RedisStore

    return RedisStore.from_url(
        redis_url, prefix=prefix, ttl=ttl, clock=clock, rng=rng, buffer_limit=buffer_limit
    )
