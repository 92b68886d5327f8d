"""What `MemoryStore` keeps for a single node in place of the cluster state the Redis
store shares: quota slots (counted in this process: nothing to expire, the process that
holds them is the one that counts them), upload job records (with their TTL), and
takeovers (this process's own, fanned out to its watcher)."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace

import orjson

from store.api import SUBSCRIBER_QUEUE, TOMBSTONE_S, JobEntry, Lease, QuotaClaim
from store.errors import QuotaFull, SubscriptionLost
from store.listener import Listener

logger = logging.getLogger(__name__)


def new_node_id() -> str:
    """This process's id as the store names it: host, pid and a random part (a restarted
    process is another node)."""
    host = "".join(c if c.isalnum() or c in "-." else "-" for c in socket.gethostname())
    return f"{host[:40] or 'node'}-{os.getpid()}-{secrets.token_hex(3)}"


class MemoryQuotas:
    """Slots per (quota, key): lease id → holder, in this process."""

    def __init__(self) -> None:
        self._slots: dict[tuple[str, str], dict[str, str]] = {}

    async def acquire(self, claims: Sequence[QuotaClaim], lease_id: str | None = None) -> Lease:
        lease = Lease(lease_id or secrets.token_hex(8), secrets.token_hex(8), tuple(claims))
        for claim in claims:
            held = self._slots.get((claim.name, claim.key), {})
            if lease.id not in held and len(held) >= claim.limit:
                raise QuotaFull(claim.name, claim.key, claim.limit)
        for claim in claims:
            self._slots.setdefault((claim.name, claim.key), {})[lease.id] = lease.holder
        return lease

    async def rebind(self, lease: Lease, lease_id: str) -> Lease:
        for claim in lease.claims:
            held = self._slots.get((claim.name, claim.key), {})
            if held.get(lease.id) == lease.holder:
                del held[lease.id]
                held[lease_id] = lease.holder
        return replace(lease, id=lease_id)

    async def release(self, lease: Lease) -> None:
        for claim in lease.claims:
            slot = (claim.name, claim.key)
            held = self._slots.get(slot, {})
            if held.get(lease.id) == lease.holder:
                del held[lease.id]
                if not held:
                    del self._slots[slot]

    def held(self, name: str, key: str) -> int:
        return len(self._slots.get((name, key), {}))

    def __bool__(self) -> bool:
        return bool(self._slots)


@dataclass
class _Job:
    body: bytes
    finished: bool
    expires_at: float
    cancel: bool = False


class MemoryJobs:
    """Job records of this process; its node is always alive (it is this process)."""

    def __init__(self, node_id: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.node_id = node_id
        self._clock = clock
        self._jobs: dict[str, _Job] = {}

    def _live(self, job_id: str) -> _Job | None:
        job = self._jobs.get(job_id)
        if job is not None and job.expires_at <= self._clock():
            del self._jobs[job_id]
            return None
        return job

    async def put(self, job_id: str, body: bytes, *, finished: bool, ttl_s: float) -> bool:
        job = self._live(job_id)
        if job is not None and job.cancel:
            return False
        now = self._clock()
        self._jobs[job_id] = _Job(body, finished, now + ttl_s)
        for expired in [j for j, v in self._jobs.items() if v.expires_at <= now]:
            del self._jobs[expired]
        return True

    async def get(self, job_id: str) -> JobEntry | None:
        job = self._live(job_id)
        if job is None or job.cancel:
            return None
        return JobEntry(job.body, self.node_id, job.finished, node_alive=True)

    async def request_cancel(self, job_id: str) -> bool:
        job = self._live(job_id)
        if job is None or job.cancel:
            return False
        job.cancel = True
        return True

    async def cancelled(self, job_id: str) -> bool:
        job = self._live(job_id)
        return job is not None and job.cancel

    async def delete(self, job_id: str) -> None:
        self._jobs[job_id] = _Job(b"", False, self._clock() + TOMBSTONE_S, cancel=True)

    def __len__(self) -> int:
        return len(self._jobs)


class MemoryTakeovers:
    """A single node's takeovers: its registry supersedes the old connection itself, so
    nothing is announced to the watchers (there is no other node to tell)."""

    def __init__(self, node_id: str, subscriber_queue: int = SUBSCRIBER_QUEUE) -> None:
        self._node_id = node_id
        self._subscriber_queue = subscriber_queue
        self._watchers: set[Listener] = set()

    async def announce(self, meeting_id: str, session_id: str) -> None:
        return None

    @contextlib.asynccontextmanager
    async def watch(self) -> AsyncIterator[AsyncIterator[tuple[str, str]]]:
        listener = Listener(self._subscriber_queue)
        self._watchers.add(listener)
        try:
            yield decoded_takeovers(listener.events(), self._node_id)
        finally:
            self._watchers.discard(listener)

    def close(self) -> None:
        for listener in self._watchers:
            listener.drop(SubscriptionLost("the store was closed"))
        self._watchers.clear()


def encode_takeover(meeting_id: str, session_id: str, node_id: str) -> bytes:
    return orjson.dumps([meeting_id, session_id, node_id])


async def decoded_takeovers(
    events: AsyncIterator[bytes], node_id: str
) -> AsyncIterator[tuple[str, str]]:
    """(meeting id, session id) of the takeovers other nodes than `node_id` announced; a
    message that is not one (bad JSON, another shape: anyone who can publish on the
    channel can send it) is logged and skipped."""
    async for event in events:
        try:
            message = orjson.loads(event)
        except orjson.JSONDecodeError:
            message = None
        if not (
            isinstance(message, list)
            and len(message) == 3
            and all(isinstance(part, str) for part in message)
        ):
            logger.warning("a takeover message that is none skipped: %r", event[:200])
            continue
        meeting_id, session_id, announced_by = message
        if announced_by != node_id:
            yield meeting_id, session_id
