"""`MemoryStore`: the `Store` in process, for a single node, with the same TTL policy as
Redis (driven by the injected clock). Everything is lost when the process exits."""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from store.api import SUBSCRIBER_QUEUE
from store.enrolled import MemorySpeakerBook
from store.errors import (
    ResumeTokenMismatch,
    SourceSuperseded,
    SubscriptionLost,
    UnknownResumeToken,
)
from store.listener import Listener
from store.memory_cluster import MemoryJobs, MemoryQuotas, MemoryTakeovers, new_node_id
from store.records import (
    FinalRecord,
    NewFinal,
    SourceState,
    StoreHealth,
    check_append,
    hash_token,
    new_source,
)
from store.ttl import Clock, TTLSettings, draw_jitter, system_clock, ttl_ms
from wire.query import validate_id


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
        self.speakers = MemorySpeakerBook()
        self.node_id = new_node_id()
        self.quotas = MemoryQuotas()
        self.jobs = MemoryJobs(self.node_id)
        self.takeovers = MemoryTakeovers(self.node_id, subscriber_queue)

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
        self,
        meeting_id: str,
        participant: str,
        config: Mapping[str, Any] | None = None,
        *,
        origin: float | None = None,
    ) -> tuple[SourceState, str]:
        validate_id("meeting_id", meeting_id)
        state, token = new_source(
            meeting_id, participant, self._clock() if origin is None else origin
        )
        meeting = self._live(meeting_id)
        if meeting is None:
            meeting = self._meetings[meeting_id] = _Meeting()
        if meeting.config is None and config is not None:
            meeting.config = dict(config)
        digest = hash_token(token)
        meeting.sources[state.session_id] = state
        meeting.tokens[digest] = state.session_id
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

    @property
    def failures(self) -> int:
        return 0  # in process: nothing to fail to reach

    async def health(self) -> StoreHealth:
        return StoreHealth(backend=self.backend, ok=True)

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        for listeners in self._listeners.values():
            for listener in listeners:
                listener.drop(SubscriptionLost("the store was closed"))
        self._listeners.clear()
        self.takeovers.close()
