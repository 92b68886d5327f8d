"""Model workers as processes: a Recognizer whose batches run in supervised child processes.

Why: with model workers as threads, every worker and the event loop share one GIL. A
decoder step is ~150 small torch operations; each releases the GIL for its arithmetic and
takes it back for the Python around it, so a worker that wants it back waits behind the
event loop (or the other worker) for up to the interpreter's switch interval, once per
operation. Under load on the CPU the workers were "busy" most of the time while the
server left part of the machine idle
(docs/history/2026-12-03-evening-ice-lake.md#the-gil-a-shorter-switch-interval-then-model-workers-as-processes-kept).
A process per worker has a GIL of its own; the event loop keeps its own.

How: `ProcessRecognizer` keeps `processes` slots, each holding a child (spawned: a fork
of a process with torch's and asyncio's threads is unsafe) that loads the model itself
with `threads` torch threads and warms it up (`engine.workers.child`). `transcribe` takes
an idle child, sends it the batch and blocks its caller (a scheduler worker thread, which
holds no GIL while it waits) until the child answers. The scheduler never runs more
batches at once than it has workers, so with every child up a call never waits for one.
A stop (`should_stop`) is passed on through a flag in shared memory that the child's
recognizer polls as it would its own.

Supervision (alive is not healthy; docs/operations.md#model-worker-processes):
- A child that dies while it runs a batch is seen within `STOP_POLL_S`; one that stops
  beating (`engine.workers.child`: it polls the stop flag at every encoder row and decoder
  step) for `hang_after` seconds (`PARLEY_WORKER_HANG_S`, 10 s) is hung and SIGKILLed, as
  is one that does not answer a stop within `STOP_GRACE_S` (so a shutdown never waits on
  it). Either way the batch runs again at once on another child, or on the replacement
  when none is up (`MAX_ATTEMPTS` children at most, then it fails): its rows are not
  lost. An idle child that dies is seen by the supervisor within `SUPERVISE_POLL_S`.
- A lost child is replaced in the background by the supervisor thread, never in a batch's
  path: the first time at once, then after a backoff that doubles (`backoff`) while the
  slot keeps losing children without finishing a batch. A replacement that fails to load,
  dies while loading or is not ready within `load_timeout` is killed and retried the
  same way. A dead child is never handed a batch again.
- `health()` says how many children are up and how many were replaced, by reason
  (`died`, `hung`, `load_failed`): the server's /readyz and /metrics read it.
- The supervisor thread starts every child, so that the kernel's parent-death signal
  (bound to the starting thread) fires only when the pool is gone; `close()` ends them
  all within `CLOSE_TIMEOUT_S` (a loading or hung child is killed, not waited for).
"""

from __future__ import annotations

import collections
import enum
import logging
import multiprocessing
import multiprocessing.connection
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from engine.api import Transcription, Utterance
from engine.choices import ProcessMode
from engine.loading import ModelConfig, resolve_device
from engine.recognizer import Interrupted, StopCheck
from engine.workers.child import (
    STOP_POLL_S,
    ChildProcess,
    Ready,
    WorkerLost,
)

logger = logging.getLogger(__name__)

SUPERVISE_POLL_S = 0.05  # how often the supervisor looks at idle and loading children
READY_TIMEOUT_S = 300.0  # a child that has not loaded its model by then is given up
HANG_AFTER_S = 10.0  # a child running a batch that has not beaten for this long is hung
CLOSE_TIMEOUT_S = 2.0  # how long children get to end after `Close` before they are killed
MAX_ATTEMPTS = 3  # children a batch may lose before it fails
BACKOFF_BASE_S = 1.0  # the second restart in a row waits this long, each later one twice
BACKOFF_MAX_S = 30.0

RESTART_REASONS = ("died", "hung", "load_failed")


@dataclass(frozen=True, slots=True)
class WorkerHealth:
    """The pool as /readyz and /metrics see it."""

    processes: int  # slots
    alive: int  # children loaded and serving (idle or busy)
    restarts: dict[str, int]  # children replaced, by `RESTART_REASONS`
    pids: tuple[int, ...] = ()  # the children's processes now (loading ones included)
    busy: tuple[int, ...] = ()  # those running a batch


def backoff(losses: int) -> float:
    """The wait before restarting a slot that lost `losses` children in a row (without a
    batch finished in between): none for the first, then 1, 2, 4 ... 30 s."""
    return 0.0 if losses <= 1 else min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (losses - 2))


# ------------------------------------------------------------------------------- slots
class SlotState(enum.Enum):
    DOWN = "down"  # no child: one starts at `due`
    LOADING = "loading"
    IDLE = "idle"
    BUSY = "busy"


@dataclass(slots=True)
class _Slot:
    index: int
    state: SlotState = SlotState.DOWN
    child: ChildProcess | None = None
    due: float = 0.0  # DOWN: when the next child starts; LOADING: when it is given up
    losses: int = 0  # children lost (or failed to load) in a row, without a batch finished


@dataclass(slots=True)
class _Start:
    """What the first load came to: the first Ready, or the first failure."""

    ready: Ready | None = None
    error: str | None = None
    done: bool = False  # every slot up, or one failed
    waiting: bool = True  # still in `__init__`: a failure is not retried, it is raised
    slots_ready: int = 0


class ProcessRecognizer:
    """The Whisper recognizer `config` describes, run in `processes` supervised child
    processes of `threads` torch threads each (see the module doc), each trimming its heap
    every `trim_interval` seconds between batches (`engine.memory`; 0: never); a child
    that runs a batch without a heartbeat for `hang_after` seconds is hung. Blocks in
    `__init__` until every child has loaded and warmed up its model (or one failed:
    RuntimeError); `close()` ends them."""

    def __init__(
        self,
        config: ModelConfig,
        processes: int,
        threads: int,
        trim_interval: float = 60.0,
        *,
        hang_after: float = HANG_AFTER_S,
        load_timeout: float = READY_TIMEOUT_S,
    ) -> None:
        if processes < 1 or threads < 1:
            raise ValueError("need at least one process of at least one thread")
        if hang_after <= 0 or load_timeout <= 0:
            raise ValueError("hang_after and load_timeout must be positive")
        # Convert a packaged model once, here, not in every child at the same time.
        from engine.whisper.weights import resolve_model

        resolve_model(config.model, config.cache)
        self._config, self._threads, self._trim_interval = config, threads, trim_interval
        self._hang_after, self.load_timeout = hang_after, load_timeout
        self._cond = threading.Condition()
        self._closed = False
        self._slots = [_Slot(i) for i in range(processes)]
        self._idle: collections.deque[_Slot] = collections.deque()
        self._restarts = dict.fromkeys(RESTART_REASONS, 0)
        self._start = _Start()
        self._supervisor = threading.Thread(
            target=self._supervise, name="parley-model-supervisor", daemon=True
        )
        self._supervisor.start()
        with self._cond:
            self._cond.wait_for(lambda: self._start.done)
            self._start.waiting = False
        if self._start.error is not None or self._start.ready is None:
            self.close()
            raise RuntimeError(self._start.error)
        self._ready = self._start.ready
        logger.info(
            "%s in %d worker processes (%d torch threads each)", self.name, processes, threads
        )

    @property
    def name(self) -> str:
        return self._ready.name

    @property
    def languages(self) -> frozenset[str]:
        return self._ready.languages

    @property
    def processes(self) -> int:
        return len(self._slots)

    def warmup(self) -> None:
        """Nothing to do: each child warmed its model up before it said it was ready."""

    def health(self) -> WorkerHealth:
        with self._cond:
            up = (SlotState.IDLE, SlotState.BUSY)
            return WorkerHealth(
                processes=len(self._slots),
                alive=sum(1 for s in self._slots if s.state in up),
                restarts=dict(self._restarts),
                pids=tuple(s.child.process.pid or 0 for s in self._slots if s.child),
                busy=tuple(
                    s.child.process.pid or 0
                    for s in self._slots
                    if s.child and s.state is SlotState.BUSY
                ),
            )

    # ------------------------------------------------------------------ batches

    def transcribe(
        self, batch: Sequence[Utterance], should_stop: StopCheck | None = None
    ) -> list[Transcription]:
        utterances = list(batch)
        lost: WorkerLost | None = None
        for _ in range(MAX_ATTEMPTS):
            slot = self._take(should_stop)
            child = slot.child
            assert child is not None  # an IDLE slot has one
            try:
                result = child.run(utterances, should_stop, self._hang_after)
            except WorkerLost as exc:
                child.kill()
                self._lose(slot, child, exc.reason)
                logger.error("%s; its batch of %d runs again", exc, len(utterances))
                lost = exc
                continue
            except BaseException:
                self._release(slot, finished=False)
                raise
            self._release(slot, finished=True)
            return result
        assert lost is not None
        raise lost

    def _take(self, should_stop: StopCheck | None) -> _Slot:
        """An idle slot, now BUSY; waits for one (Interrupted when stopped meanwhile)."""
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("the model worker processes are closed")
                if self._idle:
                    slot = self._idle.popleft()
                    slot.state = SlotState.BUSY
                    return slot
                if should_stop is not None and should_stop():
                    raise Interrupted("stopped while waiting for a model worker process")
                self._cond.wait(STOP_POLL_S * 3)

    def _release(self, slot: _Slot, *, finished: bool) -> None:
        with self._cond:
            if slot.state is SlotState.BUSY:
                slot.state = SlotState.IDLE
                slot.losses = 0 if finished else slot.losses
                self._idle.append(slot)
                self._cond.notify_all()

    def _lose(self, slot: _Slot, child: ChildProcess, reason: str) -> None:
        """The slot's child is gone (`reason`: a RESTART_REASONS): restart it (backoff)."""
        with self._cond:
            if slot.child is not child or slot.state is SlotState.DOWN:
                return
            if slot in self._idle:
                self._idle.remove(slot)
            if not self._closed:  # `close()` kills busy children: no restart to count
                self._restarts[reason] += 1
            slot.losses += 1
            slot.state, slot.child = SlotState.DOWN, None
            slot.due = time.monotonic() + backoff(slot.losses)
            self._cond.notify_all()

    # ------------------------------------------------------------------ supervisor

    def _supervise(self) -> None:
        """Start children where slots are down and due, see them ready (or failed), and
        notice idle children that died; at `close()`, end them (this thread started
        them: their parent-death signal is bound to it)."""
        try:
            while not self._closed:
                try:
                    self._supervise_once()
                except Exception:  # a bug: log it, and keep the pool supervised
                    logger.exception("model worker supervisor")
                    time.sleep(SUPERVISE_POLL_S)
        finally:
            self._end_children()

    def _supervise_once(self) -> None:
        with self._cond:
            watched = [
                (s, s.child)
                for s in self._slots
                if s.child is not None and s.state in (SlotState.LOADING, SlotState.IDLE)
            ]
            due = [s for s in self._slots if s.state is SlotState.DOWN]
        waitables: list[object] = [
            c.conn if s.state is SlotState.LOADING else c.process.sentinel for s, c in watched
        ]
        multiprocessing.connection.wait(waitables, SUPERVISE_POLL_S)  # type: ignore[arg-type]
        now = time.monotonic()
        for slot, child in watched:
            if slot.state is SlotState.LOADING:
                self._check_load(slot, child, now)
            elif slot.state is SlotState.IDLE and not child.process.is_alive():
                self._lose(slot, child, "died")  # out of `_idle` before its pipe is closed
                child.kill()
                logger.error("idle model worker process %d died; restarting", slot.index)
        for slot in due:
            if slot.due <= now and not self._closed:
                self._spawn(slot)

    def _spawn(self, slot: _Slot) -> None:
        # A replacement skips the warm-up: it decodes silence in every window (7 encoder
        # passes, seconds at one thread on a loaded CPU) while finals wait for it, and a
        # cold first batch took no longer than a warm one.
        warm = self._start.waiting
        child = ChildProcess(slot.index, self._config, self._threads, self._trim_interval, warm)
        with self._cond:
            if self._closed or slot.state is not SlotState.DOWN:
                closing = True
            else:
                closing = False
                slot.state, slot.child = SlotState.LOADING, child
                slot.due = time.monotonic() + self.load_timeout
        if closing:
            child.kill()

    def _check_load(self, slot: _Slot, child: ChildProcess, now: float) -> None:
        """A loading child that said Ready goes idle; one that failed, died or is late is
        killed and its slot restarted later (the first load: `__init__` raises)."""
        loaded = child.loaded()
        if loaded is None and now < slot.due:
            return
        if isinstance(loaded, Ready):
            with self._cond:
                slot.state = SlotState.IDLE
                self._idle.append(slot)
                start = self._start
                start.ready = start.ready or loaded
                start.slots_ready += 1
                start.done |= start.slots_ready >= len(self._slots)
                self._cond.notify_all()
            if not start.waiting:
                logger.warning("model worker process %d is up again", slot.index)
            return
        error = loaded or f"not ready in {self.load_timeout:.0f} s"
        child.kill()
        with self._cond:
            if self._start.waiting:  # the first load: `__init__` raises it
                self._start.error = f"model worker process {slot.index}: {error}"
                self._start.done = True
                slot.state, slot.child, slot.due = SlotState.DOWN, None, float("inf")
                self._cond.notify_all()
                return
        self._lose(slot, child, "load_failed")
        logger.error(
            "model worker process %d failed to load (%s); next try in %.0f s",
            slot.index,
            error,
            backoff(slot.losses),
        )

    # ------------------------------------------------------------------ close

    def close(self) -> None:
        """End every child (see `_end_children`), and the supervisor."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._supervisor is not threading.current_thread():
            self._supervisor.join(CLOSE_TIMEOUT_S + 10.0)

    def _end_children(self) -> None:
        """Idle children are asked to close and given `CLOSE_TIMEOUT_S`; loading, busy or
        hung ones (or any still there then) are killed."""
        with self._cond:
            self._closed = True
            slots = [(s, s.child) for s in self._slots if s.child is not None]
        idle = [c for s, c in slots if s.state is SlotState.IDLE]
        for child in idle:
            child.ask_to_close()
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        for child in idle:
            child.process.join(max(0.0, deadline - time.monotonic()))
        for _, child in slots:
            child.kill()


def in_processes(mode: ProcessMode, config: ModelConfig) -> bool:
    """Whether the model workers run as processes: `on`, or `auto` on the CPU (measured
    there: bench/workers.py, docs/performance.md#workers-and-batches); on CUDA `auto` keeps
    threads (one worker, and a CUDA context per process costs GPU memory)."""
    return mode == "on" or (mode == "auto" and resolve_device(config) == "cpu")
