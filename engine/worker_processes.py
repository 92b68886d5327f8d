"""Model workers as processes: a Recognizer whose batches run in child processes.

Why: with model workers as threads, every worker and the event loop share one GIL. A
decoder step is ~150 small torch operations; each releases the GIL for its arithmetic and
takes it back for the Python around it, so a worker that wants it back waits behind the
event loop (or the other worker) for up to the interpreter's switch interval, once per
operation. On the 2-core CPU at 16 rooms the two workers were "busy" 85-90 % of the time
while the server used 1.3-1.4 cores with the machine ~10 % idle (docs/performance.md,
"Model workers as processes"). A process per worker has a GIL of its own; the event loop
keeps its own.

How: `ProcessRecognizer` starts `processes` children (spawned: a fork of a process with
torch's and asyncio's threads is unsafe), each loading the model itself with `threads`
torch threads and warming it up. `transcribe` takes an idle child, sends it the batch and
blocks its caller (a scheduler worker thread, which holds no GIL while it waits) until
the child answers. The scheduler never runs more batches at once than it has workers, so
with one child per worker a call never waits for a child. A stop (`should_stop`) is passed
on through a flag in shared memory that the child's recognizer polls as it would its own;
the waiting thread looks at `should_stop` every `STOP_POLL_S`.

A child that dies fails its batch (`WorkerProcessDied`) and is replaced before it is used
again. Children ignore SIGINT (a Ctrl-C in a terminal reaches the whole process group: the
server drains, then closes them) and end when their pipe closes, so they do not outlive a
server that was killed.

Messages are typed (`Batch`, `Close` in; `Ready`, `Done`, `Stopped`, `Failed` out); every
payload is pickled by `multiprocessing.connection`. An utterance's audio is at most a few
MB, microseconds to copy next to the tens of milliseconds a batch takes.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import queue
import signal
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnProcess
from typing import Any, Literal

from engine.api import Transcription, Utterance
from engine.loading import ModelConfig, load_whisper, resolve_device, set_torch_threads
from engine.memory import malloc_trim
from engine.recognizer import Interrupted, StopCheck

logger = logging.getLogger(__name__)

STOP_POLL_S = 0.003  # how often a waiting worker thread looks at `should_stop`
READY_TIMEOUT_S = 600.0  # a child that has not loaded its model by then is given up
CLOSE_TIMEOUT_S = 5.0  # how long a child gets to end after `Close` before it is killed


class WorkerProcessDied(RuntimeError):
    """A model worker process ended while it held a batch (or before it was ready)."""


# ----------------------------------------------------------------------------- messages
@dataclass(frozen=True, slots=True)
class Batch:
    utterances: list[Utterance]


@dataclass(frozen=True, slots=True)
class Close:
    pass


@dataclass(frozen=True, slots=True)
class Ready:
    name: str
    languages: frozenset[str]
    max_batch_size: int


@dataclass(frozen=True, slots=True)
class Done:
    transcriptions: list[Transcription]


@dataclass(frozen=True, slots=True)
class Stopped:
    pass


@dataclass(frozen=True, slots=True)
class Failed:
    error: str  # "TypeName: message"
    details: str  # the child's traceback


# ------------------------------------------------------------------------------- child
def _child_main(
    config: ModelConfig, threads: int, trim_interval: float, conn: Connection, stop: Any
) -> None:
    """A child's whole life: load, say Ready, then run batches until Close or EOF; after
    a batch, give the heap's free pages back once `trim_interval` seconds have passed
    since the last time (0: never)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="model worker %(process)d: %(message)s")
    try:
        recognizer = load_whisper(config)
        set_torch_threads(threads)  # after the load, which sets the loading thread's count
        recognizer.warmup()
    except Exception as exc:  # sent to the parent, which raises it
        conn.send(Failed(f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        return
    conn.send(Ready(recognizer.name, recognizer.languages, recognizer.max_batch_size))
    trim = malloc_trim() if trim_interval > 0 else None
    trimmed = time.monotonic()

    def should_stop() -> bool:
        return bool(stop.value)

    while True:
        try:
            message = conn.recv()
        except EOFError:  # the parent is gone
            return
        if isinstance(message, Close):
            return
        if not isinstance(message, Batch):
            conn.send(Failed(f"TypeError: unexpected message {message!r}", ""))
            continue
        try:
            reply: Done | Stopped | Failed = Done(
                recognizer.transcribe(message.utterances, should_stop)
            )
        except Interrupted:
            reply = Stopped()
        except Exception as exc:
            reply = Failed(f"{type(exc).__name__}: {exc}", traceback.format_exc())
        conn.send(reply)
        if trim is not None and time.monotonic() - trimmed >= trim_interval:
            trim()
            trimmed = time.monotonic()


# ------------------------------------------------------------------------------ parent
class _Child:
    """One child process, its end of the pipe and its stop flag."""

    def __init__(self, index: int, config: ModelConfig, threads: int, trim_interval: float) -> None:
        context = multiprocessing.get_context("spawn")
        self.index = index
        self.stop = context.RawValue(ctypes.c_bool, False)
        self.conn, child_conn = context.Pipe()
        self.process: SpawnProcess = context.Process(
            target=_child_main,
            args=(config, threads, trim_interval, child_conn, self.stop),
            name=f"parley-model-{index}",
            daemon=True,
        )
        self.process.start()
        child_conn.close()

    def wait_ready(self, timeout: float) -> Ready:
        reply = self._receive(timeout)
        if isinstance(reply, Failed):
            raise RuntimeError(f"model worker process {self.index}: {reply.error}")
        if not isinstance(reply, Ready):
            raise RuntimeError(f"model worker process {self.index} sent {reply!r} first")
        return reply

    def run(
        self, utterances: list[Utterance], should_stop: StopCheck | None
    ) -> list[Transcription]:
        self.stop.value = False
        try:
            self.conn.send(Batch(utterances))
        except OSError:  # BrokenPipeError: it is gone
            raise self._died() from None
        while not self.conn.poll(STOP_POLL_S):
            if not self.process.is_alive():
                raise self._died()
            if should_stop is not None and not self.stop.value and should_stop():
                self.stop.value = True
        reply = self._receive(0)
        if isinstance(reply, Done):
            return reply.transcriptions
        if isinstance(reply, Stopped):
            raise Interrupted("the batch was stopped")
        if isinstance(reply, Failed):
            logger.error("model worker process %d failed a batch:\n%s", self.index, reply.details)
            raise RuntimeError(reply.error)
        raise RuntimeError(f"model worker process {self.index} sent {reply!r}")

    def _receive(self, timeout: float) -> object:
        try:
            if not self.conn.poll(timeout):
                raise RuntimeError(
                    f"model worker process {self.index} did not answer in {timeout:.0f} s"
                )
            return self.conn.recv()
        except (EOFError, OSError):
            raise self._died() from None

    def _died(self) -> WorkerProcessDied:
        self.process.join(1.0)
        return WorkerProcessDied(
            f"model worker process {self.index} died (exit code {self.process.exitcode})"
        )

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # already gone
            self.conn.send(Close())
        self.process.join(CLOSE_TIMEOUT_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


class ProcessRecognizer:
    """The Whisper recognizer `config` describes, run in `processes` child processes of
    `threads` torch threads each (see the module doc), each trimming its heap every
    `trim_interval` seconds between batches (`engine.memory`; 0: never). Blocks in
    `__init__` until every child has loaded and warmed up its model; `close()` ends them."""

    def __init__(
        self, config: ModelConfig, processes: int, threads: int, trim_interval: float = 60.0
    ) -> None:
        if processes < 1 or threads < 1:
            raise ValueError("need at least one process of at least one thread")
        # Convert a packaged model once, here, not in every child at the same time.
        from engine.weights import resolve_model

        resolve_model(config.model, config.cache)
        self._config, self._threads, self._trim_interval = config, threads, trim_interval
        self._lock = threading.Lock()
        self._closed = False
        self._children = [_Child(i, config, threads, trim_interval) for i in range(processes)]
        try:
            ready = [child.wait_ready(READY_TIMEOUT_S) for child in self._children]
        except BaseException:
            self.close()
            raise
        self._ready = ready[0]
        self._idle: queue.SimpleQueue[_Child] = queue.SimpleQueue()
        for child in self._children:
            self._idle.put(child)
        logger.info(
            "%s in %d worker processes (%d torch threads each)",
            self._ready.name,
            processes,
            threads,
        )

    @property
    def name(self) -> str:
        return self._ready.name

    @property
    def max_batch_size(self) -> int:
        return self._ready.max_batch_size

    @property
    def languages(self) -> frozenset[str]:
        return self._ready.languages

    @property
    def processes(self) -> int:
        return len(self._children)

    def warmup(self) -> None:
        """Nothing to do: each child warmed its model up before it said it was ready."""

    def transcribe(
        self, batch: Sequence[Utterance], should_stop: StopCheck | None = None
    ) -> list[Transcription]:
        if self._closed:
            raise RuntimeError("the model worker processes are closed")
        child = self._idle.get()
        try:
            return child.run(list(batch), should_stop)
        except WorkerProcessDied:
            child = self._replace(child)
            raise
        finally:
            self._idle.put(child)

    def _replace(self, dead: _Child) -> _Child:
        """A new child in a dead one's place (blocking while it loads its model)."""
        logger.error("model worker process %d died; starting another", dead.index)
        dead.close()
        child = _Child(dead.index, self._config, self._threads, self._trim_interval)
        with self._lock:
            self._children[dead.index] = child
        child.wait_ready(READY_TIMEOUT_S)
        return child

    def close(self) -> None:
        """End every child (each finishes the batch it runs first, within a few seconds)."""
        self._closed = True
        with self._lock:
            children = list(self._children)
        for child in children:
            child.close()


ProcessMode = Literal["auto", "on", "off"]


def in_processes(mode: ProcessMode, config: ModelConfig) -> bool:
    """Whether the model workers run as processes: `on`, or `auto` on the CPU (measured
    there: bench/workers.py, docs/performance.md); on CUDA `auto` keeps threads (one
    worker, and a CUDA context per process costs GPU memory)."""
    return mode == "on" or (mode == "auto" and resolve_device(config) == "cpu")
