"""Limits a stream lives under, quotas, and admission by measured capacity.

- `LimitedConnection` wraps a stream's socket for the session actor: it closes a stream
  idle for too long (4408) or running for too long (4413, after its finals), and reads
  audio no faster than `RealtimeBudget` allows (pacing, not refusal: a client that sends
  faster simply waits on TCP).
- `Slots` counts held slots per key against one limit, on this node: sockets waiting
  to authenticate (1013), listeners in all (1013). `StreamSlot` (streams per tenant,
  4429) and `ListenerQuota` (listeners per meeting and per tenant, 4429) hold leases in
  the store's quotas: with Redis they count across every node, and a dead node's
  expire with its lease (store/redis/leases.py).
- `Turns` lets a few of one kind of request run at once (enrollments), a bounded number
  wait a bounded time for a turn, and answers the rest `overloaded` (HTTP 503).
- `CapacityMonitor` watches the scheduler: when finals have recently waited too long for
  the model, or a full batch of finals is queued, new streams are refused with 1013.
  Partials are not a signal: they fill whatever the model has spare and thin out first.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from engine.api import Priority, RecognitionRequest, RecognitionResult
from engine.scheduling.scheduler import BatchScheduler
from session.stream_state import Connection
from store.api import Lease, QuotaClaim, Quotas
from store.errors import QuotaFull, StoreError
from wire.codes import CloseCode, ErrorCode
from wire.errors import ProtocolError

RETRY_AFTER_S = 5.0  # what a refused client is told to wait
CAPACITY_WINDOW_S = 10.0  # how far back the capacity monitor looks
MIN_SAMPLES = 4  # finals in the window before their wait is a signal


class RealtimeBudget:
    """A token bucket of audio seconds: refills at `factor` per wall second, holds at most
    `burst_s`. `spend()` says how long to wait before the audio may be read."""

    def __init__(self, factor: float, burst_s: float, now: float) -> None:
        self._factor = factor
        self._burst = burst_s
        self._tokens = burst_s
        self._at = now

    def widen(self, audio_s: float) -> None:
        """`audio_s` more may come at once, once: a resumed client's re-sent lead."""
        self._burst += audio_s
        self._tokens += audio_s

    def spend(self, audio_s: float, now: float) -> float:
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._factor)
        self._at = now
        self._tokens -= audio_s
        return 0.0 if self._tokens >= 0 else -self._tokens / self._factor


class LimitedConnection:
    """The stream's socket as the actor sees it, with the idle and duration limits and
    the real-time pacing applied in `receive()`. A limit raises ProtocolError, which the
    actor handles like bad input: the utterance in progress is finalized, every final is
    sent, then the `error` and the close."""

    def __init__(
        self,
        websocket: Connection,
        *,
        idle_timeout_s: float,
        max_duration_s: float,
        budget: RealtimeBudget | None,
        bytes_per_second: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._websocket = websocket
        self._idle = idle_timeout_s
        self._max_duration = max_duration_s
        self._ends_at = clock() + max_duration_s
        self._budget = budget
        self._bytes_per_second = bytes_per_second
        self._clock = clock

    async def receive(self) -> Any:
        left = self._ends_at - self._clock()
        if left <= 0:
            raise self._too_long()
        try:
            async with asyncio.timeout(min(self._idle, left)):
                message = await self._websocket.receive()
        except TimeoutError:
            if self._clock() >= self._ends_at:
                raise self._too_long() from None
            raise ProtocolError(
                ErrorCode.TIMEOUT,
                CloseCode.TIMEOUT,
                f"no audio or keepalive for {self._idle:g} s",
            ) from None
        data = message.get("bytes")
        if data and self._budget is not None:
            delay = self._budget.spend(len(data) / self._bytes_per_second, self._clock())
            if delay > 0:
                await asyncio.sleep(delay)
        return message

    async def send_text(self, data: str) -> None:
        await self._websocket.send_text(data)

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        await self._websocket.close(code, reason)

    def _too_long(self) -> ProtocolError:
        return ProtocolError(
            ErrorCode.MAX_DURATION,
            CloseCode.MAX_DURATION,
            f"the stream reached its limit of {self._max_duration:g} s; reconnect to go on",
        )


class Slots:
    """Held slots per key against one limit (per node)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: Counter[str] = Counter()

    def held(self, key: str) -> int:
        return self._held[key]

    @property
    def in_use(self) -> int:
        """Slots held, over every key."""
        return sum(self._held.values())

    def acquire(self, key: str) -> bool:
        if self._held[key] >= self.limit:
            return False
        self._held[key] += 1
        return True

    def release(self, key: str) -> None:
        self._held[key] -= 1
        if self._held[key] <= 0:
            del self._held[key]


class Turns:
    """At most `limit` holders at once, on this node; at most `max_waiting` callers wait
    for a turn, each at most `wait_s`: past either bound, ProtocolError `overloaded`."""

    def __init__(self, what: str, limit: int, max_waiting: int, wait_s: float) -> None:
        self._what = what
        self._free = asyncio.Semaphore(limit)
        self._max_waiting = max_waiting
        self._wait_s = wait_s
        self.waiting = 0
        self.held = 0

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        if self._free.locked() and self.waiting >= self._max_waiting:
            raise overloaded(f"{self.waiting} {self._what} already wait for a turn")
        self.waiting += 1
        try:
            async with asyncio.timeout(self._wait_s):
                await self._free.acquire()
        except TimeoutError:
            raise overloaded(f"no turn for {self._what} within {self._wait_s:g} s") from None
        finally:
            self.waiting -= 1
        self.held += 1
        try:
            yield
        finally:
            self.held -= 1
            self._free.release()


ALL = ""  # the key of a Slots that counts one thing server-wide


STREAMS = "streams"  # per tenant
LISTENERS_PER_MEETING = "listeners-meeting"
LISTENERS_PER_TENANT = "listeners-tenant"


class ListenerQuota:
    """Listener sockets per meeting and per tenant (authenticated), in the store's
    quotas, and in all on this node."""

    def __init__(self, quotas: Quotas, per_meeting: int, per_tenant: int, total: int) -> None:
        self._quotas = quotas
        self.per_meeting = per_meeting
        self.per_tenant = per_tenant
        self.total = Slots(total)

    def held(self, meeting_id: str) -> int:
        """The meeting's listeners on this node."""
        return self._quotas.held(LISTENERS_PER_MEETING, meeting_id)

    async def acquire(self, meeting_id: str, tenant: str | None) -> Lease:
        """Take a slot of each kind, or none: raise ProtocolError 4429 (the meeting's or
        the tenant's quota) or 1013 (this node's bound, or the store is unreachable)."""
        if not self.total.acquire(ALL):
            raise overloaded(f"server has {self.total.limit} listeners open (the limit)")
        claims = [QuotaClaim(LISTENERS_PER_MEETING, meeting_id, self.per_meeting)]
        if tenant is not None:
            claims.insert(0, QuotaClaim(LISTENERS_PER_TENANT, tenant, self.per_tenant))
        try:
            return await self._quotas.acquire(claims)
        except QuotaFull as exc:
            self.total.release(ALL)
            if exc.name == LISTENERS_PER_TENANT:
                raise quota_exceeded(
                    f"tenant has {self.per_tenant} listeners open (the limit)"
                ) from None
            raise quota_exceeded(f"meeting has {self.per_meeting} listeners already") from None
        except StoreError as exc:
            self.total.release(ALL)
            raise overloaded(f"quota store: {exc}") from None
        except BaseException:
            self.total.release(ALL)
            raise

    async def release(self, lease: Lease) -> None:
        self.total.release(ALL)
        await self._quotas.release(lease)


class StreamSlot:
    """One stream's slot of its tenant's quota (none for anonymous streams), held under
    its source's session id: a resume of the source takes the slot over instead of
    counting twice while the old connection is still open (on any node)."""

    def __init__(self, quotas: Quotas, tenant: str | None, limit: int) -> None:
        self._quotas = quotas
        self._claim = None if tenant is None else QuotaClaim(STREAMS, tenant, limit)
        self._lease: Lease | None = None

    async def take(self, session_id: str | None = None) -> None:
        """Take the slot (under `session_id`, if known yet), or raise ProtocolError: 4429
        at the tenant's limit, 1013 if the store is unreachable."""
        if self._claim is None:
            return
        try:
            self._lease = await self._quotas.acquire([self._claim], session_id)
        except QuotaFull:
            raise quota_exceeded(
                f"tenant has {self._claim.limit} streams open (the limit)"
            ) from None
        except StoreError as exc:
            raise overloaded(f"quota store: {exc}") from None

    async def bind(self, session_id: str) -> None:
        """The stream's source is known: hold the slot under its session id (take it now,
        for a resumed source). Raises ProtocolError like `take`."""
        if self._claim is None:
            return
        if self._lease is None:
            await self.take(session_id)
            return
        try:
            self._lease = await self._quotas.rebind(self._lease, session_id)
        except StoreError as exc:
            raise overloaded(f"quota store: {exc}") from None

    async def release(self) -> None:
        if self._lease is not None:
            lease, self._lease = self._lease, None
            await self._quotas.release(lease)


def quota_exceeded(message: str) -> ProtocolError:
    return ProtocolError(
        ErrorCode.QUOTA_EXCEEDED,
        CloseCode.TOO_MANY_REQUESTS,
        message,
        retry_after=RETRY_AFTER_S,
    )


def overloaded(message: str) -> ProtocolError:
    return ProtocolError(
        ErrorCode.OVERLOADED, CloseCode.TRY_AGAIN_LATER, message, retry_after=RETRY_AFTER_S
    )


class CapacityMonitor:
    """Measures how long finals wait for the model; a BatchScheduler observer."""

    def __init__(
        self,
        max_queue_wait_s: float,
        max_batch_size: int,
        *,
        window_s: float = CAPACITY_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_wait = max_queue_wait_s
        self._max_batch_size = max_batch_size
        self._window = window_s
        self._clock = clock
        self._waits: deque[tuple[float, float]] = deque()  # (when, queue wait) of finals
        self._busy: deque[tuple[float, float]] = deque()  # (when, inference) of batches

    def observe_batch(
        self, requests: Sequence[RecognitionRequest], results: Sequence[RecognitionResult]
    ) -> None:
        now = self._clock()
        for request, result in zip(requests, results, strict=True):
            # A speculative final's wait is its final's (the final takes its result).
            if request.priority in (Priority.FINAL, Priority.SPECULATIVE):
                self._waits.append((now, result.queue_wait))
        if results:
            self._busy.append((now, results[0].inference))
        self._forget(now)

    def _forget(self, now: float) -> None:
        for samples in (self._waits, self._busy):
            while samples and samples[0][0] < now - self._window:
                samples.popleft()

    def final_wait(self) -> float | None:
        """Median queue wait of the finals run in the window; None with too few of them.
        The median, not a high percentile: one final that landed behind a long batch of
        partials is not overload; half of them waiting that long is."""
        self._forget(self._clock())
        if len(self._waits) < MIN_SAMPLES:
            return None
        waits = sorted(w for _, w in self._waits)
        return waits[len(waits) // 2]

    def utilisation(self) -> float:
        """Share of the window the model spent running batches (partials included)."""
        self._forget(self._clock())
        return min(1.0, sum(b for _, b in self._busy) / self._window)

    def refusal(self, scheduler: BatchScheduler | None) -> str | None:
        """Why a new stream would overload the model now, or None."""
        if self._max_wait <= 0:
            return None
        queued = scheduler.depth_by_priority()[Priority.FINAL] if scheduler else 0
        if queued >= self._max_batch_size:
            return f"model is behind: {queued} finals queued; retry later"
        wait = self.final_wait()
        if wait is not None and wait > self._max_wait:
            return (
                f"model is at capacity: finals waited {wait * 1000:.0f} ms for it "
                f"(median; limit {self._max_wait * 1000:.0f} ms); retry later"
            )
        return None
