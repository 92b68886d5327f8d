# One concept, 460 lines: the loop that runs what the policy plans (policy, queue and records
# are modules of their own already); what is left is the futures, the workers and the wakes.
"""BatchScheduler: one queue for every session, a few model workers, one policy.

Sessions `submit()` recognition requests and await the result. The scheduler keeps the
queue and the futures; `engine.scheduling.policy` decides what runs: finals first on any free
worker, a running partial batch stopped when finals find no worker free, partials on their share
of the model's time, an utterance's first partial first, then the stalest session. Each
worker is a thread of its own that runs one batch at a time on the recognizer (which
must be safe to call from several threads: `WhisperRecognizer` holds no batch state);
the event loop never waits on the model.

Rules:
- A session has at most one queued partial: a newer one replaces it (the old future
  fails with RequestSuperseded). A partial batch that is stopped puts its partials back
  in the queue, still the stalest, unless a newer one of the session came meanwhile.
  The same holds for a session's speculative final; `promote` turns it into a final
  (queued: as if submitted now; running: no longer stopped for finals), `expedite` into
  an awaited one (a turn decision waits on it). The queue and
  these per-session records are engine/scheduling/request_queue.py's.
- The queue is bounded. A partial or speculative request that finds it full fails with
  SchedulerFull at once (they thin out first); a final or file request waits for room
  instead, so finals are never dropped — the wait pushes back on the session that
  submitted it.
- Left context is shed under load (`context_below`, `context_budget`): the load gate of
  engine/scheduling/context_gate.py decides, per batch, whether live finals go behind their left
  context or alone (`stats.contexts_shed`); an `essential` one (the final starts inside
  a word) is always kept.
- A batch's results come back as a list the same length as its input; a recognizer
  error (or a length mismatch) fails every future of that batch, and the workers go on.
- If the scheduler itself fails (a bug, an observer that raises), it is DEAD: every
  queued request, the batches running and every later `submit` fail at once with
  EngineDead and its reason, instead of waiting for a loop that is gone.

The request types, priorities and errors are engine/api.py's: sessions see the scheduler
only as its `Recognition` protocol. Its records (entries, workers, busy time, statistics)
are engine/scheduling/records.py's.
"""

from __future__ import annotations

import asyncio
import enum
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
from engine.recognizer import Interrupted, Recognizer
from engine.scheduling.config import SchedulerConfig
from engine.scheduling.context_gate import ContextGate
from engine.scheduling.policy import PartialBudget, PartialCost, plan
from engine.scheduling.records import BusyTime, Entry, SchedulerStats, Worker
from engine.scheduling.request_queue import LATEST_ONLY, RequestQueue

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
        config: SchedulerConfig,
        *,
        worker_init: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._gate = ContextGate(config.context_below, config.context_budget, clock)
        self._recognizer = recognizer
        self._config = config
        self._clock = clock
        self._budget = PartialBudget(self._config, clock())
        self._partial_cost = PartialCost()
        self._queue = RequestQueue(config.max_queue)
        self._wakeup = asyncio.Event()
        self._planned = asyncio.Event()  # the loop has planned with every change so far
        self._room = asyncio.Event()  # set whenever the queue drops below its bound
        self._workers = [
            Worker(
                i,
                ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix=f"parley-model-{i}", initializer=worker_init
                ),
            )
            for i in range(config.workers)
        ]
        self._task: asyncio.Task[None] | None = None
        self.busy = BusyTime()  # recent (start, end) of batches
        self._observers: list[BatchObserver] = []
        self.state = SchedulerState.CREATED
        self.death: EngineDead | None = None  # why it died (state DEAD)
        self.stats = SchedulerStats()

    @property
    def config(self) -> SchedulerConfig:
        return self._config

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
        for entry in self._queue:
            depth[entry.request.priority] += 1
        return depth

    @property
    def utilization(self) -> float:
        """Fraction of the last `BusyTime.window` seconds the workers spent on batches."""
        running = (w.started for w in self._workers if w.batch)
        return self.busy.utilization(self._clock(), running, len(self._workers))

    @property
    def finals_utilization(self) -> float:
        """Fraction of the last `BusyTime.window` seconds the workers spent on batches that
        held a final or a file request (partial and speculative batches left out)."""
        return self._gate.finals_utilization(self._workers)

    def has_context_slack(self, oldest: float | None = None) -> bool:
        """Whether live finals may be decoded behind their left context now (a batch
        whose oldest final was cut at `oldest`): `ContextGate.has_slack`."""
        return self._gate.has_slack(self._queue, self._workers, oldest)

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
        if request.priority in LATEST_ONLY:
            previous = self._queue.supersede(request)
            if previous is not None:
                if request.priority is Priority.PARTIAL:
                    since = previous.since  # the session has been waiting since then
                    self.stats.partials_superseded += 1
                previous.fail(RequestSuperseded("a newer request replaced this one"))
            elif self._queue.full:
                self.stats.partials_rejected += 1
                raise SchedulerFull("recognition queue is full")
        else:
            while self._queue.full and self.state is SchedulerState.RUNNING:
                self._room.clear()
                await self._room.wait()
            if self.state is not SchedulerState.RUNNING:
                raise self._refusal()
            # `now` stays the time of the call: a final's queue wait includes its wait for
            # room, so latency and admission control see the backpressure.
        future = asyncio.get_running_loop().create_future()
        entry = self._queue.add(request, future, now, since)
        self._wake()
        return entry.future

    def cancel(self, session_id: str, *, only: Priority | None = None) -> int:
        """Drop a session's queued requests (or only those of priority `only`); their
        futures are cancelled.

        A request already running finishes, and its result is discarded by the caller;
        but with `only` PARTIAL or SPECULATIVE, a running batch of only the session's
        requests of that priority (a stale partial at its utterance's speculation or
        final; a speculation withdrawn) is stopped, its futures cancelled: its model time
        goes to what still matters. Returns how many queued requests were dropped.
        """
        dropped = self._queue.cancel(session_id, only)
        for entry in dropped:
            entry.future.cancel()
        if only in (Priority.PARTIAL, Priority.SPECULATIVE):
            for worker in self._workers:
                batch = worker.batch
                if batch and all(
                    e.request.priority is only and e.request.session_id == session_id for e in batch
                ):
                    for entry in batch:
                        entry.future.cancel()
                    worker.stop.set()
                    self.stats.cancelled_batches[only] += 1
        self._room.set()
        return len(dropped)

    def promote(self, request: RecognitionRequest) -> bool:
        """The SPECULATIVE `request` (the object submitted) is a final from now on."""
        if self._queue.promote(request, self._clock()):  # its wait as a final starts now
            self._wake()
            return True
        if (running := self._running(request)) is None:
            return False
        running.request = replace(request, priority=Priority.FINAL)
        return True

    def expedite(self, request: RecognitionRequest) -> bool:
        """The SPECULATIVE `request` (the object submitted) is waited on from now."""
        if self._queue.expedite(request):
            self._wake()
            return True
        if (running := self._running(request)) is None:
            return False
        running.expedited = True
        return True

    def _running(self, request: RecognitionRequest) -> Entry | None:
        """The entry of `request` (the object submitted) in a running batch, if any."""
        return next((e for w in self._workers for e in w.batch if e.request is request), None)

    async def planned(self) -> None:
        """Wait until the loop has planned with every change so far (requests submitted
        or promoted, batches ended): by then the batches it chose are launched and those
        it chose to stop are told to. What it does later on a timer is not waited for."""
        await self._planned.wait()

    def _wake(self) -> None:
        """Something changed: the loop plans again."""
        self._planned.clear()
        self._wakeup.set()

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
                [e.view() for e in self._queue],
                [w.index for w in self._workers if not w.batch],
                [w.view() for w in running],
                self._budget,
                self._config,
                now,
                self._partial_cost.per_row,
            )
            for index in decision.preempt:
                self._workers[index].stop.set()
                self.stats.preempted_batches += 1
            for start in decision.starts:
                self._launch(self._workers[start.worker], start.keys, start.partial)
            self._wakeup.clear()
            self._planned.set()
            timeout = None if decision.wake_at is None else max(0.0, decision.wake_at - now)
            try:
                async with asyncio.timeout(timeout):
                    await self._wakeup.wait()
            except TimeoutError:
                pass

    def _launch(self, worker: Worker, keys: Sequence[int], partial: bool) -> None:
        entries = self._queue.take(keys)
        self._room.set()
        live = [e for e in entries if not e.future.done()]
        if not live:
            return
        worker.batch, worker.partial, worker.started = live, partial, self._clock()
        worker.expected_end = (
            self._partial_cost.expected_end(worker.started, len(live), self._config.flat_batches)
            if partial
            else None
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
            self.busy.add(started, ended)
            self._gate.batch_ended(worker, started, ended, ran=results is not None)
            kind = Priority.PARTIAL if worker.partial else min(e.request.priority for e in live)
            self.stats.model_seconds[kind] += ended - started
            if worker.partial:
                self._budget.charge(ended - started, ended)
                if results is not None:  # ran to its end: what a partial row costs
                    self._partial_cost.record(ended - started, len(live))
            worker.batch, worker.task = [], None
            self._wake()

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
                queued = self._queue.partial_of(entry.request.session_id)
                if queued is not None:
                    queued.drafted = True  # its utterance has a partial now: not a first one
        return results

    def _utterances(self, worker: Worker, live: Sequence[Entry]) -> list[Utterance]:
        """The batch's utterances, live finals without their left context unless the
        model has room for it (engine/scheduling/context_gate.py): a loaded server sheds the
        context's cost before it sheds rooms or makes a final late."""
        utterances, shed = self._gate.utterances(live, self._queue, self._workers)
        self.stats.contexts_shed += shed
        worker.behind_context = any(u.left is not None for u in utterances)
        return utterances

    def _requeue(self, stopped: list[Entry]) -> None:
        """Put a stopped batch's requests back (partial and speculative batches are
        stopped; a speculative final promoted meanwhile goes back as a final), unless a
        newer partial or speculative request of their session came meanwhile."""
        for entry in stopped:
            if entry.future.done() or self.state is not SchedulerState.RUNNING:
                continue
            if not self._queue.put_back(entry):
                if entry.request.priority is Priority.PARTIAL:
                    self.stats.partials_superseded += 1
                entry.fail(RequestSuperseded("a newer request replaced this one"))

    def _fail_all(self, error: Exception) -> None:
        for entry in (*self._queue.clear(), *(e for w in self._workers for e in w.batch)):
            entry.fail(error)

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
