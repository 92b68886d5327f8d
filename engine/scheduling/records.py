"""The records `engine.scheduling.scheduler` keeps: a queued or running request, a model worker, the
recent busy time of the workers, the scheduler's statistics.

They hold state and show it to `engine.scheduling.policy` (`view()`); the scheduler alone changes
them. Only `SchedulerStats` is read outside the engine (metrics, tests).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from engine.api import Priority, RecognitionRequest, RecognitionResult
from engine.scheduling.policy import Queued, Running

LOAD_WINDOW = 2.0  # seconds over which the model's utilization is measured


@dataclass(slots=True)
class Entry:
    """A request in the scheduler, from `submit` until its future is settled."""

    request: RecognitionRequest
    future: asyncio.Future[RecognitionResult]
    submitted_at: float
    key: int
    since: float  # the policy's order: a final's submit time, a partial's staleness
    # A partial of its session came back with text while this one was queued: its
    # utterance has shown a partial, though this request's draft predates it.
    drafted: bool = False
    # Waited on since it was submitted (`BatchScheduler.expedite`), as an awaited one is.
    expedited: bool = False

    @property
    def awaited(self) -> bool:
        return self.request.awaited or self.expedited

    def view(self) -> Queued:
        request = self.request
        first = (
            request.priority is Priority.PARTIAL
            and not request.utterance.draft
            and not self.drafted
        )
        return Queued(self.key, request.priority, self.since, first, self.awaited)

    def fail(self, error: Exception) -> None:
        if not self.future.done():
            self.future.set_exception(error)
            # Nobody may await a superseded or cancelled request; don't log "never retrieved".
            self.future.exception()


@dataclass(slots=True)
class Worker:
    """A model thread and the batch it runs (none while `batch` is empty)."""

    index: int
    executor: ThreadPoolExecutor
    stop: threading.Event = field(default_factory=threading.Event)
    batch: list[Entry] = field(default_factory=list)
    partial: bool = False
    started: float = 0.0
    expected_end: float | None = None  # a partial batch's, if its cost is known
    behind_context: bool = False  # some row of the batch went with its left context
    task: asyncio.Task[None] | None = None

    def view(self) -> Running:
        speculative = all(e.request.priority is Priority.SPECULATIVE for e in self.batch)
        awaited = speculative and any(e.awaited for e in self.batch)
        return Running(
            self.index, self.partial, self.stop.is_set(), speculative, self.expected_end, awaited
        )

    def holds_finals(self) -> bool:
        """Whether the batch holds a final or a file request (not only partials or
        speculative finals, which run on time finals leave)."""
        return not self.partial and any(e.request.priority <= Priority.FILE for e in self.batch)


@dataclass(slots=True)
class BusyTime:
    """The (start, end) of the batches that ended within the last `window` seconds."""

    window: float = LOAD_WINDOW
    spans: deque[tuple[float, float]] = field(default_factory=deque)

    def add(self, start: float, end: float) -> None:
        self.spans.append((start, end))
        self.forget(end)  # bounded even when nobody reads `utilization`

    def forget(self, now: float) -> float:
        """Drop the batches that ended before the window; return its start."""
        horizon = now - self.window
        while self.spans and self.spans[0][1] <= horizon:
            self.spans.popleft()
        return horizon

    def utilization(self, now: float, running_since: Iterable[float], workers: int) -> float:
        """Fraction of the last `window` seconds `workers` spent on batches, counting the
        batches still running (started at `running_since`)."""
        horizon = self.forget(now)
        busy = sum(end - max(start, horizon) for start, end in self.spans)
        busy += sum(now - max(started, horizon) for started in running_since)
        return min(1.0, busy / (self.window * workers))


@dataclass
class SchedulerStats:
    """Counters for metrics and tests. Read them; only the scheduler writes them."""

    batches: int = 0
    requests: int = 0
    failed_batches: int = 0
    partials_superseded: int = 0
    partials_rejected: int = 0
    preempted_batches: int = 0  # partial batches stopped for finals
    # Running batches stopped by `cancel`: a session's stale partial or withdrawn speculation.
    cancelled_batches: dict[Priority, int] = field(
        default_factory=lambda: dict.fromkeys(Priority, 0)
    )
    contexts_shed: int = 0  # live finals decoded without their left context (load gate)
    # Model time by the kind of batch (a stopped partial batch's time counts as partial).
    model_seconds: dict[Priority, float] = field(
        default_factory=lambda: dict.fromkeys(Priority, 0.0)
    )
    batch_sizes: list[int] = field(default_factory=list)  # the last `history` batches
    batch_sessions: list[frozenset[str]] = field(default_factory=list)
    history: int = 1000

    def record_batch(self, entries: Sequence[Entry]) -> None:
        self.batches += 1
        self.requests += len(entries)
        self.batch_sizes.append(len(entries))
        self.batch_sessions.append(frozenset(e.request.session_id for e in entries))
        del self.batch_sizes[: -self.history]
        del self.batch_sessions[: -self.history]
