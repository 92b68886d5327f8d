"""Limits a stream lives under, quotas, and admission by measured capacity.

- `LimitedConnection` wraps a stream's socket for the session actor: it closes a stream
  idle for too long (4408) or running for too long (4413, after its finals), and reads
  audio no faster than `RealtimeBudget` allows (pacing, not refusal: a client that sends
  faster simply waits on TCP).
- `Slots` counts held slots per key against one limit: streams per tenant (4429),
  sockets waiting to authenticate (1013); `ListenerQuota` holds listeners per meeting
  and per tenant (4429) and in all (1013).
- `CapacityMonitor` watches the scheduler: when finals have recently waited too long for
  the model, or a full batch of finals is queued, new streams are refused with 1013.
  Partials are not a signal: they fill whatever the model has spare and thin out first.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import Any

from engine.api import Priority, RecognitionRequest, RecognitionResult
from engine.scheduler import BatchScheduler
from session.stream_state import Connection
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

    def acquire(self, key: str) -> bool:
        if self._held[key] >= self.limit:
            return False
        self._held[key] += 1
        return True

    def release(self, key: str) -> None:
        self._held[key] -= 1
        if self._held[key] <= 0:
            del self._held[key]


ALL = ""  # the key of a Slots that counts one thing server-wide


class ListenerQuota:
    """Listener sockets per meeting, per tenant (authenticated) and in all, per node."""

    def __init__(self, per_meeting: int, per_tenant: int, total: int) -> None:
        self.meetings = Slots(per_meeting)
        self.tenants = Slots(per_tenant)
        self.total = Slots(total)

    def held(self, meeting_id: str) -> int:
        return self.meetings.held(meeting_id)

    def acquire(self, meeting_id: str, tenant: str | None) -> None:
        """Take a slot of each kind, or none: raise ProtocolError 4429 (the meeting's or
        the tenant's quota) or 1013 (the server's bound)."""
        if not self.total.acquire(ALL):
            raise overloaded(f"server has {self.total.limit} listeners open (the limit)")
        if tenant is not None and not self.tenants.acquire(tenant):
            self.total.release(ALL)
            raise quota_exceeded(f"tenant has {self.tenants.limit} listeners open (the limit)")
        if not self.meetings.acquire(meeting_id):
            self.total.release(ALL)
            if tenant is not None:
                self.tenants.release(tenant)
            raise quota_exceeded(f"meeting has {self.meetings.limit} listeners already")

    def release(self, meeting_id: str, tenant: str | None) -> None:
        self.meetings.release(meeting_id)
        if tenant is not None:
            self.tenants.release(tenant)
        self.total.release(ALL)


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
