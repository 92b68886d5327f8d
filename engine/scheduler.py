"""BatchScheduler: one queue for every session, one worker thread for the model.

Sessions `submit()` recognition requests and await the result. A single loop takes the
most urgent requests (finals before file work before partials, oldest first), waits up
to `max_wait` for a batch to fill, runs the recognizer on the dedicated worker thread,
and settles one future per request. The event loop never waits on the model.

Rules:
- A session has at most one queued partial: a newer one replaces it (the old future
  fails with RequestSuperseded).
- The queue is bounded. A partial that finds it full fails with SchedulerFull at once
  (partials thin out first); a final or file request waits for room instead, so finals
  are never dropped — the wait pushes back on the session that submitted it.
- A batch's results come back as a list the same length as its input; a recognizer
  error (or a length mismatch) fails every future of that batch, and the loop goes on.
- If the loop itself dies (a bug, an observer that raises), the scheduler is DEAD: every
  queued request, the batch it was running and every later `submit` fail at once with
  EngineDead and its reason, instead of waiting for a loop that is gone.

The request types, priorities and errors are engine/api.py's: sessions see the scheduler
only as its `Recognition` protocol.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from engine.api import (
    BatchFailed,
    EngineDead,
    Priority,
    RecognitionRequest,
    RecognitionResult,
    RequestSuperseded,
    SchedulerFull,
    SchedulerStopped,
)
from engine.recognizer import Recognizer

logger = logging.getLogger(__name__)

LOAD_WINDOW = 2.0  # seconds over which the model's utilization is measured


class SchedulerState(enum.Enum):
    CREATED = "created"
    RUNNING = "running"
    STOPPED = "stopped"
    DEAD = "dead"  # the loop died: every waiting and later request fails with EngineDead


@dataclass(slots=True)
class _Entry:
    request: RecognitionRequest
    future: asyncio.Future[RecognitionResult]
    submitted_at: float
    order: int

    def sort_key(self) -> tuple[int, int]:
        return (self.request.priority, self.order)


@dataclass
class SchedulerStats:
    """Counters for metrics and tests. Read them; only the scheduler writes them."""

    batches: int = 0
    requests: int = 0
    failed_batches: int = 0
    partials_superseded: int = 0
    partials_rejected: int = 0
    batch_sizes: list[int] = field(default_factory=list)  # the last `history` batches
    batch_sessions: list[frozenset[str]] = field(default_factory=list)
    history: int = 1000

    def record_batch(self, entries: Sequence[_Entry]) -> None:
        self.batches += 1
        self.requests += len(entries)
        self.batch_sizes.append(len(entries))
        self.batch_sessions.append(frozenset(e.request.session_id for e in entries))
        del self.batch_sizes[: -self.history]
        del self.batch_sessions[: -self.history]


BatchObserver = Callable[[Sequence[RecognitionRequest], Sequence[RecognitionResult]], None]


class BatchScheduler:
    """Batches recognition requests from all sessions onto one model worker thread."""

    def __init__(
        self,
        recognizer: Recognizer,
        *,
        max_batch_size: int = 16,
        max_wait: float = 0.02,
        max_queue: int = 256,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        if max_queue < max_batch_size:
            raise ValueError("max_queue must be >= max_batch_size")
        self._recognizer = recognizer
        self._max_batch_size = min(max_batch_size, recognizer.max_batch_size)
        self._max_wait = max_wait
        self._max_queue = max_queue
        self._clock = clock
        self._queue: list[_Entry] = []
        self._partials: dict[str, _Entry] = {}  # session_id → its queued partial
        self._order = itertools.count()
        self._wakeup = asyncio.Event()
        self._room = asyncio.Event()  # set whenever the queue drops below its bound
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parley-model")
        self._task: asyncio.Task[None] | None = None
        self._running_batch: list[_Entry] = []
        self._batch_started: float | None = None
        self._busy: deque[tuple[float, float]] = deque()  # recent (start, end) of batches
        self._observers: list[BatchObserver] = []
        self.state = SchedulerState.CREATED
        self.death: EngineDead | None = None  # why the loop died (state DEAD)
        self.stats = SchedulerStats()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self.state is not SchedulerState.CREATED:
            raise RuntimeError(f"cannot start a scheduler in state {self.state.value}")
        self.state = SchedulerState.RUNNING
        self._task = asyncio.create_task(self._run(), name="batch-scheduler")

    async def drain(self, timeout: float) -> bool:
        """Wait until every queued request has run, up to `timeout`. True if drained."""
        deadline = self._clock() + timeout
        while self.has_unfinished_requests():
            if self._clock() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    async def stop(self) -> None:
        """Fail what is still queued, finish the batch in flight, stop the worker thread."""
        if self.state is SchedulerState.STOPPED:
            return
        self.state = SchedulerState.STOPPED  # a DEAD scheduler keeps its `death`
        for entry in self._queue:
            _fail(entry, SchedulerStopped("scheduler stopped before the request ran"))
        self._queue.clear()
        self._partials.clear()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._room.set()
        # The batch in flight (if any) still holds the thread: wait for it off the loop.
        await asyncio.to_thread(self._executor.shutdown, wait=True)

    def add_observer(self, observer: BatchObserver) -> None:
        """Call `observer(requests, results)` on the event loop after each good batch."""
        self._observers.append(observer)

    # ------------------------------------------------------------------ front

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    def depth_by_priority(self) -> dict[Priority, int]:
        depth = dict.fromkeys(Priority, 0)
        for entry in self._queue:
            depth[entry.request.priority] += 1
        return depth

    @property
    def utilization(self) -> float:
        """Fraction of the last `LOAD_WINDOW` seconds the model worker spent on batches."""
        now = self._clock()
        horizon = now - LOAD_WINDOW
        while self._busy and self._busy[0][1] <= horizon:
            self._busy.popleft()
        busy = sum(end - max(start, horizon) for start, end in self._busy)
        if self._batch_started is not None:
            busy += now - max(self._batch_started, horizon)
        return min(1.0, busy / LOAD_WINDOW)

    @property
    def load(self) -> float:
        """How busy the model is: its recent utilization (0..1) plus the queued requests
        per batch slot. Below 1 there is spare capacity; above it, a backlog."""
        return self.utilization + len(self._queue) / self._max_batch_size

    def has_unfinished_requests(self) -> bool:
        return bool(self._queue or self._running_batch)

    async def submit(self, request: RecognitionRequest) -> asyncio.Future[RecognitionResult]:
        """Queue a request; return the future of its result.

        A partial replaces the session's queued partial, or fails with SchedulerFull when
        the queue is full. Finals and file requests wait for room.
        """
        if self.state is not SchedulerState.RUNNING:
            raise self._refusal()
        if request.priority is Priority.PARTIAL:
            previous = self._partials.pop(request.session_id, None)
            if previous is not None:
                self._queue.remove(previous)
                self.stats.partials_superseded += 1
                _fail(previous, RequestSuperseded("a newer partial replaced this one"))
            elif len(self._queue) >= self._max_queue:
                self.stats.partials_rejected += 1
                raise SchedulerFull("recognition queue is full")
        else:
            while len(self._queue) >= self._max_queue and self.state is SchedulerState.RUNNING:
                self._room.clear()
                await self._room.wait()
            if self.state is not SchedulerState.RUNNING:
                raise self._refusal()
        entry = _Entry(
            request=request,
            future=asyncio.get_running_loop().create_future(),
            submitted_at=self._clock(),
            order=next(self._order),
        )
        self._queue.append(entry)
        if request.priority is Priority.PARTIAL:
            self._partials[request.session_id] = entry
        self._wakeup.set()
        return entry.future

    def cancel(self, session_id: str, *, partials_only: bool = False) -> int:
        """Drop a session's queued requests (or only its partial); their futures are cancelled.

        A request already running finishes, and its result is discarded by the caller.
        Returns how many queued requests were dropped.
        """
        dropped = [
            e
            for e in self._queue
            if e.request.session_id == session_id
            and (not partials_only or e.request.priority is Priority.PARTIAL)
        ]
        for entry in dropped:
            self._queue.remove(entry)
            entry.future.cancel()
        self._partials.pop(session_id, None)
        self._room.set()
        return len(dropped)

    def _refusal(self) -> SchedulerStopped | EngineDead:
        return self.death or SchedulerStopped(f"scheduler is {self.state.value}")

    # ------------------------------------------------------------------ loop

    async def _run(self) -> None:
        """The loop, and what happens when it dies of anything but `stop()`."""
        try:
            await self._loop()
        except asyncio.CancelledError:
            if self.state is SchedulerState.RUNNING:  # cancelled, but not by stop()
                self._die("the scheduler's loop was cancelled")
            raise
        except Exception as exc:
            logger.exception("the scheduler's loop died; failing every request from now on")
            self._die(f"the scheduler's loop died: {type(exc).__name__}: {exc}")

    def _die(self, reason: str) -> None:
        """DEAD: fail what waits (and the batch the loop held) now, and every later submit."""
        self.state = SchedulerState.DEAD
        self.death = EngineDead(reason)
        for entry in (*self._running_batch, *self._queue):
            _fail(entry, self.death)
        self._queue.clear()
        self._partials.clear()
        self._running_batch = []
        self._room.set()  # finals waiting for room see the state and raise

    def _take_batch(self) -> list[_Entry]:
        self._queue.sort(key=_Entry.sort_key)
        batch = self._queue[: self._max_batch_size]
        del self._queue[: self._max_batch_size]
        for entry in batch:
            if entry.request.priority is Priority.PARTIAL:
                self._partials.pop(entry.request.session_id, None)
        return batch

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            if not self._queue:
                continue
            # Let a batch fill: up to max_wait after the oldest request arrived.
            oldest = min(e.submitted_at for e in self._queue)
            remaining = self._max_wait - (self._clock() - oldest)
            if remaining > 0 and len(self._queue) < self._max_batch_size:
                await asyncio.sleep(remaining)
            batch = self._take_batch()
            if self._queue:
                self._wakeup.set()
            self._room.set()
            live = [e for e in batch if not e.future.done()]
            if not live:
                continue
            self._running_batch = live
            started = self._clock()
            self._batch_started = started
            try:
                transcriptions = await loop.run_in_executor(
                    self._executor,
                    self._recognizer.transcribe,
                    [e.request.utterance for e in live],
                )
                if len(transcriptions) != len(live):
                    raise BatchFailed(
                        f"recognizer returned {len(transcriptions)} results for a batch of "
                        f"{len(live)}"
                    )
            except asyncio.CancelledError:
                for entry in live:
                    _fail(entry, SchedulerStopped("scheduler stopped during the batch"))
                raise
            except Exception as exc:
                logger.exception("recognition batch of %d failed", len(live))
                self.stats.failed_batches += 1
                error = exc if isinstance(exc, BatchFailed) else BatchFailed(str(exc))
                error.__cause__ = exc if error is not exc else None
                for entry in live:
                    _fail(entry, error)
                continue
            finally:
                self._running_batch = []
                self._batch_started = None
                self._busy.append((started, self._clock()))
            inference = self._clock() - started
            self.stats.record_batch(live)
            results = [
                RecognitionResult(
                    transcription=t,
                    queue_wait=started - e.submitted_at,
                    inference=inference,
                    batch_size=len(live),
                )
                for e, t in zip(live, transcriptions, strict=True)
            ]
            for entry, result in zip(live, results, strict=True):
                if not entry.future.done():
                    entry.future.set_result(result)
            for observer in self._observers:
                observer([e.request for e in live], results)


def _fail(entry: _Entry, error: Exception) -> None:
    if not entry.future.done():
        entry.future.set_exception(error)
        # Nobody may await a superseded or cancelled request; don't log "never retrieved".
        entry.future.exception()
