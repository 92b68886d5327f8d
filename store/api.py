"""`Store`: the interface the sessions and routes use. `MemoryStore` (store/memory.py) is
the embedded single-node default; `RedisStore` (store/redis/store.py) keeps the same
semantics across processes; `open_store()` (store/factory.py) picks one. Errors are in
store/errors.py."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from store.enrolled import SpeakerBook
from store.records import FinalRecord, NewFinal, SourceState, StoreHealth

SUBSCRIBER_QUEUE = 256  # events buffered per listener before it is judged too slow
DEFAULT_PREFIX = "parley:"
DEFAULT_BUFFER_LIMIT = 10_000  # finals held in memory while Redis is unreachable
DEFAULT_NODE_LEASE_S = 10.0  # a node's leases (quota slots, liveness) outlive it this long


@dataclass(frozen=True, slots=True)
class QuotaClaim:
    """One slot of one quota: `name` (e.g. "streams"), the key it counts per (a tenant, a
    meeting), and the most slots that key may hold at once."""

    name: str
    key: str
    limit: int


@dataclass(frozen=True, slots=True)
class Lease:
    """Slots held together under one id by one holder (a connection). Acquiring again
    under the same id (a resumed source) takes the slots over without counting twice."""

    id: str
    holder: str
    claims: tuple[QuotaClaim, ...]


class Quotas(Protocol):
    """Quota slots as leases. Redis: shared by every node, each lease renewed by its node
    while it lives and expiring `node_lease_s` after it died. In process: this node's."""

    async def acquire(self, claims: Sequence[QuotaClaim], lease_id: str | None = None) -> Lease:
        """Take one slot of each claim, all or none; raise QuotaFull naming the first full
        claim. `lease_id`: an id this lease may already hold (then its slots are taken
        over, not counted again); None: a new one. Raises StoreUnavailable."""
        ...

    async def rebind(self, lease: Lease, lease_id: str) -> Lease:
        """The same slots under another id (a new source learns its session id)."""
        ...

    async def release(self, lease: Lease) -> None:
        """Give the slots back, unless another holder took the lease over (best effort:
        an unreachable store lets the lease expire instead)."""
        ...

    def held(self, name: str, key: str) -> int:
        """Slots of this quota and key this node holds (metrics, tests)."""
        ...


@dataclass(frozen=True, slots=True)
class JobEntry:
    """An upload job's record as another node reads it: `body` is what the node running
    it last wrote (opaque to the store), `node` that node's id."""

    body: bytes
    node: str
    finished: bool
    node_alive: bool  # False: the node's lease expired (it died) while the job was unfinished


class JobStore(Protocol):
    """Upload jobs' records, readable and cancellable from any node; the work runs on
    the node that wrote them (`node_id`)."""

    @property
    def node_id(self) -> str: ...

    async def put(self, job_id: str, body: bytes, *, finished: bool, ttl_s: float) -> bool:
        """Write this node's job's record, kept `ttl_s`. False (nothing written) when a
        cancel was requested: the caller cancels the job. Raises StoreUnavailable."""
        ...

    async def get(self, job_id: str) -> JobEntry | None:
        """The job's record, None if unknown, expired or deleted."""
        ...

    async def request_cancel(self, job_id: str) -> bool:
        """Ask the job's node to cancel it; readers see it gone at once. False: no such job."""
        ...

    async def delete(self, job_id: str) -> None: ...


class Takeovers(Protocol):
    """Who resumed which source: the node that admits a resume announces it, the node
    serving the old connection closes it (4409) at once."""

    async def announce(self, meeting_id: str, session_id: str) -> None:
        """Best effort: an unreachable store leaves the old connection to be superseded
        at its next final."""
        ...

    def watch(self) -> contextlib.AbstractAsyncContextManager[AsyncIterator[tuple[str, str]]]:
        """(meeting id, session id) of every resume another node announces from now on.
        The iterator raises SubscriberLagged if the store connection under it breaks."""
        ...


class Store(Protocol):
    @property
    def speakers(self) -> SpeakerBook:
        """The tenants' enrolled speakers (store/enrolled.py)."""
        ...

    @property
    def node_id(self) -> str:
        """This process, as the store's leases and jobs name it."""
        ...

    @property
    def quotas(self) -> Quotas: ...

    @property
    def jobs(self) -> JobStore: ...

    @property
    def takeovers(self) -> Takeovers: ...

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
