"""`Store`: the interface the sessions and routes use. `MemoryStore` (store/memory.py) is
the embedded single-node default; `RedisStore` (store/redis_store.py) keeps the same
semantics across processes; `open_store()` (store/factory.py) picks one. Errors are in
store/errors.py."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from store.enrolled import SpeakerBook
from store.records import FinalRecord, NewFinal, SourceState, StoreHealth

SUBSCRIBER_QUEUE = 256  # events buffered per listener before it is judged too slow
DEFAULT_PREFIX = "parley:"
DEFAULT_BUFFER_LIMIT = 10_000  # finals held in memory while Redis is unreachable


class Store(Protocol):
    @property
    def speakers(self) -> SpeakerBook:
        """The tenants' enrolled speakers (store/enrolled.py)."""
        ...

    async def create_source(
        self,
        meeting_id: str,
        participant: str,
        config: Mapping[str, Any] | None = None,
        *,
        origin: float | None = None,
    ) -> tuple[SourceState, str]:
        """Register a new audio source of the meeting and return its initial state and its
        resume token. The meeting is created if new; `config` becomes the meeting's config
        if it has none yet (first writer wins). `origin`: Unix seconds of the source's
        time 0 (default: now, by the store's clock); kept to the ms. Raises
        StoreOverloaded or StoreUnavailable when the session should be refused."""
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

    @property
    def failures(self) -> int:
        """Calls that failed to reach the store so far (`parley_store_errors_total`)."""
        ...

    async def health(self) -> StoreHealth:
        """ok, or degraded with a reason (unreachable, catching up, buffer full)."""
        ...

    async def ping(self) -> None:
        """Raise StoreUnavailable if the store cannot be reached."""
        ...

    async def close(self) -> None: ...
