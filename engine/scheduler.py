"""BatchScheduler: one queue for every session, a few model workers, one policy.

Sessions `submit()` recognition requests and await the result. The scheduler keeps the
queue and the futures; `engine.policy` decides what runs: finals first on any free worker,
a running partial batch stopped when finals find no worker free, partials on their share
of the model's time, an utterance's first partial first, then the stalest session. Each
worker is a thread of its own that runs one batch at a time on the recognizer (which
must be safe to call from several threads: `WhisperRecognizer` holds no batch state);
the event loop never waits on the model.

Rules:
- A session has at most one queued partial: a newer one replaces it (the old future
  fails with RequestSuperseded). A partial batch that is stopped puts its partials back
  in the queue, still the stalest, unless a newer one of the session came meanwhile.
  The same holds for a session's speculative final; `promote` turns it into a final
  (queued: as if submitted now; running: no longer stopped for finals).
- The queue is bounded. A partial or speculative request that finds it full fails with
  SchedulerFull at once (they thin out first); a final or file request waits for room
  instead, so finals are never dropped — the wait pushes back on the session that
  submitted it.
- Left context is shed under load: a live final's left context (`Utterance.left`) goes
  to the model (always where it is `essential`: the final starts inside a word) only
  while no final waits in the queue, the share of the model's recent time that finals
  and files took is below `context_below`, and the batch's oldest final
  is expected back within `context_budget` of its cut (`RecognitionRequest.closed_at`,
  else its submit; `ContextCost`); otherwise it is decoded alone (`stats.contexts_shed`).
  Partials do not count in the share: they fill whatever time finals leave, so the model
  looks busy as soon as one room speaks. File requests keep their context. None: that
  rule is off.
- A batch's results come back as a list the same length as its input; a recognizer
  error (or a length mismatch) fails every future of that batch, and the workers go on.
- If the scheduler itself fails (a bug, an observer that raises), it is DEAD: every
  queued request, the batches running and every later `submit` fail at once with
  EngineDead and its reason, instead of waiting for a loop that is gone.

The request types, priorities and errors are engine/api.py's: sessions see the scheduler
only as its `Recognition` protocol. Its records (entries, workers, busy time, statistics)
are engine/scheduler_records.py's.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from engine.api import (
    BatchFailed,
    EngineDead,
    Priority,
    RecognitionRequest,
    RecognitionResult,
    RequestSuperseded,
    SchedulerFull,
    SchedulerStopped,
    Utterance,
)
from engine.policy import ContextCost, PartialBudget, PartialCost, PolicyConfig, plan
from engine.recognizer import Interrupted, Recognizer
from engine.scheduler_records import BusyTime, Entry, SchedulerStats, Worker

logger = logging.getLogger(__name__)


class SchedulerState(enum.Enum):
    CREATED = "created"
    RUNNING = "running"
    STOPPED = "stopped"
    DEAD = "dead"  # it failed: every waiting and later request fails with EngineDead


BatchObserver = Callable[[Sequence[RecognitionRequest], Sequence[RecognitionResult]], None]


class BatchScheduler:
    """Batches recognition requests from all sessions onto `workers` model threads."""

    def __init__(
        self,
        recognizer: Recognizer,
        *,
        workers: int = 1,
        max_batch_size: int = 16,
        max_partial_batch: int = 16,
        max_wait: float = 0.02,
        max_queue: int = 256,
        partial_share: float = 0.5,
        partial_wait: float = 0.25,
        context_below: float | None = None,
        context_budget: float | None = None,
        worker_init: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        if max_queue < max_batch_size:
            raise ValueError("max_queue must be >= max_batch_size")
        if context_below is not None and not 0 < context_below <= 1:
            raise ValueError("context_below must lie in (0, 1] (None: no load gate)")
        if context_budget is not None and context_budget <= 0:
            raise ValueError("context_budget must be positive (None: no budget)")
        self._recognizer = recognizer
        batch = min(max_batch_size, recognizer.max_batch_size)
        self._policy = PolicyConfig(
            workers=workers,
            max_batch_size=batch,
            max_wait=max_wait,
            max_partial_batch=min(max_partial_batch, batch),
            partial_share=partial_share,
            partial_wait=partial_wait,
        )
        self._max_queue = max_queue
        self._context_below = context_below
        self._context_budget = context_budget
        self._context_cost = ContextCost()
        self._clock = clock
        self._budget = PartialBudget(self._policy, clock())
        self._partial_cost = PartialCost()
        self._queue: dict[int, Entry] = {}  # by key, in arrival order
        self._partials: dict[str, Entry] = {}  # session_id → its queued partial
        self._speculative: dict[str, Entry] = {}  # session_id → its queued speculative final
        self._keys = itertools.count()
        self._wakeup = asyncio.Event()
        self._room = asyncio.Event()  # set whenever the queue drops below its bound
        self._workers = [
            Worker(
                i,
                ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix=f"parley-model-{i}", initializer=worker_init
                ),
            )
            for i in range(workers)
        ]
        self._task: asyncio.Task[None] | None = None
        self._busy = BusyTime()  # recent (start, end) of batches
        self._busy_finals = BusyTime()  # of the batches that held a final or a file request
        self._observers: list[BatchObserver] = []
        self.state = SchedulerState.CREATED
        self.death: EngineDead | None = None  # why it died (state DEAD)
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
        """Fail what is still queued or running, stop the batches, stop the worker threads."""
        if self.state is SchedulerState.STOPPED:
            return
        self.state = SchedulerState.STOPPED  # a DEAD scheduler keeps its `death`
        self._fail_all(SchedulerStopped("scheduler stopped before the request ran"))
        tasks = [t for t in (self._task, *(w.task for w in self._workers)) if t is not None]
        for worker in self._workers:
            worker.stop.set()  # a batch in flight stops at its next step
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._room.set()
        for worker in self._workers:  # a batch in flight still holds its thread
            await asyncio.to_thread(worker.executor.shutdown, wait=True)

    def add_observer(self, observer: BatchObserver) -> None:
        """Call `observer(requests, results)` on the event loop after each good batch."""
        self._observers.append(observer)

    # ------------------------------------------------------------------ front

    @property
    def workers(self) -> int:
        return len(self._workers)

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    def depth_by_priority(self) -> dict[Priority, int]:
        depth = dict.fromkeys(Priority, 0)
        for entry in self._queue.values():
            depth[entry.request.priority] += 1
        return depth

    @property
    def utilization(self) -> float:
        """Fraction of the last `BusyTime.window` seconds the workers spent on batches."""
        running = (w.started for w in self._workers if w.batch)
        return self._busy.utilization(self._clock(), running, len(self._workers))

    @property
    def finals_utilization(self) -> float:
        """Fraction of the last `BusyTime.window` seconds the workers spent on batches that
        held a final or a file request (partial and speculative batches left out)."""
        running = (w.started for w in self._workers if holds_finals(w))
        return self._busy_finals.utilization(self._clock(), running, len(self._workers))

    def has_unfinished_requests(self) -> bool:
        return bool(self._queue or any(w.batch for w in self._workers))

    async def submit(self, request: RecognitionRequest) -> asyncio.Future[RecognitionResult]:
        """Queue a request; return the future of its result.

        A partial replaces the session's queued partial, or fails with SchedulerFull when
        the queue is full. Finals and file requests wait for room.
        """
        if self.state is not SchedulerState.RUNNING:
            raise self._refusal()
        now = self._clock()
        since = now
        latest = self._latest(request.priority)
        if latest is not None:
            previous = latest.pop(request.session_id, None)
            if previous is not None:
                del self._queue[previous.key]
                if request.priority is Priority.PARTIAL:
                    since = previous.since  # the session has been waiting since then
                    self.stats.partials_superseded += 1
                previous.fail(RequestSuperseded("a newer request replaced this one"))
            elif len(self._queue) >= self._max_queue:
                self.stats.partials_rejected += 1
                raise SchedulerFull("recognition queue is full")
        else:
            while len(self._queue) >= self._max_queue and self.state is SchedulerState.RUNNING:
                self._room.clear()
                await self._room.wait()
            if self.state is not SchedulerState.RUNNING:
                raise self._refusal()
            # `now` stays the time of the call: a final's queue wait includes its wait for
            # room, so latency and admission control see the backpressure.
        key = next(self._keys)
        entry = Entry(request, asyncio.get_running_loop().create_future(), now, key, since)
        self._queue[key] = entry
        if latest is not None:
            latest[request.session_id] = entry
        self._wakeup.set()
        return entry.future

    def _latest(self, priority: Priority) -> dict[str, Entry] | None:
        """The queued requests of `priority` kept one per session (the newest), if it is so."""
        if priority is Priority.PARTIAL:
            return self._partials
        return self._speculative if priority is Priority.SPECULATIVE else None

    def cancel(self, session_id: str, *, only: Priority | None = None) -> int:
        """Drop a session's queued requests (or only those of priority `only`); their
        futures are cancelled.

        A request already running finishes, and its result is discarded by the caller.
        Returns how many queued requests were dropped.
        """
        dropped = [
            e
            for e in self._queue.values()
            if e.request.session_id == session_id and only in (None, e.request.priority)
        ]
        for entry in dropped:
            del self._queue[entry.key]
            entry.future.cancel()
        if only in (None, Priority.PARTIAL):
            self._partials.pop(session_id, None)
        if only in (None, Priority.SPECULATIVE):
            self._speculative.pop(session_id, None)
        self._room.set()
        return len(dropped)

    def promote(self, request: RecognitionRequest) -> bool:
        """The SPECULATIVE `request` (the object submitted) is a final from now on."""
        now = self._clock()
        queued = self._speculative.get(request.session_id)
        if queued is not None and queued.request is request:
            del self._speculative[request.session_id]
            queued.request = replace(request, priority=Priority.FINAL)
            queued.since = queued.submitted_at = now  # its wait as a final starts now
            self._wakeup.set()
            return True
        for entry in (e for w in self._workers for e in w.batch):
            if entry.request is request:
                entry.request = replace(request, priority=Priority.FINAL)
                return True
        return False

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

    async def _loop(self) -> None:
        while True:
            now = self._clock()
            running = sorted((w for w in self._workers if w.batch), key=lambda w: w.started)
            decision = plan(
                [e.view() for e in self._queue.values()],
                [w.index for w in self._workers if not w.batch],
                [w.view() for w in running],
                self._budget,
                self._policy,
                now,
                self._partial_cost.per_row,
            )
            for index in decision.preempt:
                self._workers[index].stop.set()
                self.stats.preempted_batches += 1
            for start in decision.starts:
                self._launch(self._workers[start.worker], start.keys, start.partial)
            self._wakeup.clear()
            timeout = None if decision.wake_at is None else max(0.0, decision.wake_at - now)
            try:
                async with asyncio.timeout(timeout):
                    await self._wakeup.wait()
            except TimeoutError:
                pass

    def _launch(self, worker: Worker, keys: Sequence[int], partial: bool) -> None:
        entries = [self._queue.pop(key) for key in keys]
        for entry in entries:
            latest = self._latest(entry.request.priority)
            if latest is not None and latest.get(entry.request.session_id) is entry:
                del latest[entry.request.session_id]
        self._room.set()
        live = [e for e in entries if not e.future.done()]
        if not live:
            return
        worker.batch, worker.partial, worker.started = live, partial, self._clock()
        worker.expected_end = (
            self._partial_cost.expected_end(worker.started, len(live)) if partial else None
        )
        worker.stop.clear()
        worker.task = asyncio.create_task(self._run_batch(worker), name=f"batch-{worker.index}")

    async def _run_batch(self, worker: Worker) -> None:
        live, started = worker.batch, worker.started
        results: list[RecognitionResult] | None = None
        try:
            results = await self._transcribe(worker, live)
            if results is not None:
                for observer in self._observers:
                    observer([e.request for e in live], results)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug here, or an observer that raised
            logger.exception("the scheduler failed after a batch; failing every request")
            self._die(f"the scheduler's loop died: {type(exc).__name__}: {exc}")
        finally:
            ended = self._clock()
            self._busy.add(started, ended)
            if holds_finals(worker):
                self._busy_finals.add(started, ended)
                if results is not None and any(e.request.priority is Priority.FINAL for e in live):
                    self._context_cost.record(ended - started, behind_context=worker.behind_context)
            kind = Priority.PARTIAL if worker.partial else min(e.request.priority for e in live)
            self.stats.model_seconds[kind] += ended - started
            if worker.partial:
                self._budget.charge(ended - started, ended)
                if results is not None:  # ran to its end: what a partial row costs
                    self._partial_cost.record(ended - started, len(live))
            worker.batch, worker.task = [], None
            self._wakeup.set()

    async def _transcribe(
        self, worker: Worker, live: list[Entry]
    ) -> list[RecognitionResult] | None:
        """Run one batch and settle its futures; None if it failed or was stopped."""
        loop = asyncio.get_running_loop()
        started = worker.started
        try:
            transcriptions = await loop.run_in_executor(
                worker.executor,
                self._recognizer.transcribe,
                self._utterances(worker, live),
                worker.stop.is_set,
            )
            if len(transcriptions) != len(live):
                raise BatchFailed(
                    f"recognizer returned {len(transcriptions)} results for a batch of {len(live)}"
                )
        except asyncio.CancelledError:
            for entry in live:
                entry.fail(SchedulerStopped("scheduler stopped during the batch"))
            raise
        except Interrupted:
            self._requeue(live)
            return None
        except Exception as exc:
            logger.exception("recognition batch of %d failed", len(live))
            self.stats.failed_batches += 1
            error = exc if isinstance(exc, BatchFailed) else BatchFailed(str(exc))
            error.__cause__ = exc if error is not exc else None
            for entry in live:
                entry.fail(error)
            return None
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
            if entry.request.priority is Priority.PARTIAL and result.transcription.text:
                queued = self._partials.get(entry.request.session_id)
                if queued is not None:
                    queued.drafted = True  # its utterance has a partial now: not a first one
        return results

    def _utterances(self, worker: Worker, live: Sequence[Entry]) -> list[Utterance]:
        """The batch's utterances, live finals without their left context unless the
        model has room for it (`has_context_slack`): a loaded server sheds the context's
        cost (a longer encoder window, docs/performance.md) before it sheds rooms or makes
        a final late. A file's utterances keep theirs (no listener waits on each final)."""
        utterances = [e.request.utterance for e in live]
        sheddable = [
            u.left is not None and not u.left.essential and e.request.priority is not Priority.FILE
            for e, u in zip(live, utterances, strict=True)
        ]
        cut = [
            e.submitted_at if e.request.closed_at is None else e.request.closed_at
            for e, shed in zip(live, sheddable, strict=True)
            if shed
        ]
        if cut and not self.has_context_slack(oldest=min(cut)):
            self.stats.contexts_shed += len(cut)
            utterances = [
                replace(u, left=None) if shed else u
                for u, shed in zip(utterances, sheddable, strict=True)
            ]
        worker.behind_context = any(u.left is not None for u in utterances)
        return utterances

    def has_context_slack(self, oldest: float | None = None) -> bool:
        """Whether live finals may be decoded behind their left context now: no final
        waiting in the queue, the finals' share of the model over the last `LOAD_WINDOW`
        seconds (`finals_utilization`) below `context_below`, and a batch whose oldest
        final was cut (or submitted) at `oldest` expected back within `context_budget`. A
        rule whose setting is None does not apply; with both None there is no gate."""
        if self._context_below is None and self._context_budget is None:
            return True
        if any(e.request.priority is Priority.FINAL for e in self._queue.values()):
            return False
        if self._context_below is not None and self.finals_utilization >= self._context_below:
            return False
        expected = self._context_cost.expected()
        if self._context_budget is None or oldest is None or expected is None:
            return True
        return self._clock() - oldest + expected <= self._context_budget

    def _requeue(self, stopped: list[Entry]) -> None:
        """Put a stopped batch's requests back (partial and speculative batches are
        stopped; a speculative final promoted meanwhile goes back as a final), unless a
        newer partial or speculative request of their session came meanwhile."""
        for entry in stopped:
            session = entry.request.session_id
            if entry.future.done() or self.state is not SchedulerState.RUNNING:
                continue
            latest = self._latest(entry.request.priority)
            if latest is not None and session in latest:
                if entry.request.priority is Priority.PARTIAL:
                    self.stats.partials_superseded += 1
                entry.fail(RequestSuperseded("a newer request replaced this one"))
                continue
            self._queue[entry.key] = entry
            if latest is not None:
                latest[session] = entry

    def _fail_all(self, error: Exception) -> None:
        for entry in (*self._queue.values(), *(e for w in self._workers for e in w.batch)):
            entry.fail(error)
        self._queue.clear()
        self._partials.clear()
        self._speculative.clear()

    def _die(self, reason: str) -> None:
        """DEAD: fail what waits (and the batches running) now, and every later submit."""
        self.state = SchedulerState.DEAD
        self.death = EngineDead(reason)
        self._fail_all(self.death)
        for worker in self._workers:
            worker.stop.set()
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()  # died in a batch task: the loop has nothing left to plan
        self._room.set()  # finals waiting for room see the state and raise


def holds_finals(worker: Worker) -> bool:
    """Whether the worker's batch holds a final or a file request (not only partials or
    speculative finals, which run on time finals leave)."""
    return not worker.partial and any(e.request.priority <= Priority.FILE for e in worker.batch)
