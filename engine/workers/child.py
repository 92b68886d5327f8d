"""One model worker process: the messages it exchanges with the server, its life
(`child_main`), and the server's handle on it (`ChildProcess`: start it, run a batch on
it, tell it died or hung, kill it). `engine.workers.processes` supervises a pool of them.

Messages are typed (`Batch`, `Close` in; `Ready`, `Done`, `Stopped`, `Failed` out); every
payload is pickled by `multiprocessing.connection`. An utterance's audio is at most a few
MB, microseconds to copy next to the tens of milliseconds a batch takes.

Two values in shared memory go with the pipe: `stop`, which the parent sets to stop the
batch (the recognizer polls it between encoder rows and decoder steps), and `beat`, the
time (`time.monotonic`, one clock for every process on Linux) the child last polled it:
its heartbeat. A child that runs a batch stops beating only when it is stuck (a kernel
that never returns, a deadlock, SIGSTOP): that is how the parent tells a hung child from
a slow batch, however large the batch (gunicorn's arbiter kills a worker that has not
checked in within its timeout the same way).

A child ignores SIGINT (a Ctrl-C in a terminal reaches the whole process group: the
server drains, then closes it), and dies with its parent: on Linux the kernel sends it
SIGKILL when the thread that started it ends (PR_SET_PDEATHSIG; the parent starts its
children from one thread that lives as long as they do), busy, hung or loading; elsewhere
it ends when its pipe closes, at its next message.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnProcess
from typing import Any, Literal

from engine.api import Transcription, Utterance
from engine.loading import ModelConfig, load_whisper, set_torch_threads
from engine.memory import malloc_trim
from engine.recognizer import Interrupted, StopCheck

logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # linux/prctl.h
STOP_POLL_S = 0.003  # how often a waiting worker thread looks at its child and `should_stop`
# A child with no batch for this long gives its free heap pages back. Not shorter: the
# batch after a trim takes its pages again, ~12 ms more CPU for a one-row final (8 %,
# tiny.en), and one stream's partials every 0.5 s leave each of two children ~0.9 s idle.
IDLE_TRIM_S = 5.0
STOP_GRACE_S = 5.0  # a child told to stop that has not answered by then is hung

LossReason = Literal["died", "hung"]


class WorkerLost(RuntimeError):
    """A model worker process was lost while it held a batch: the batch may run again."""

    reason: LossReason = "died"


class WorkerProcessDied(WorkerLost):
    """A model worker process ended while it held a batch."""


class WorkerProcessHung(WorkerLost):
    """A model worker process stopped beating (or answering a stop) while it held a batch."""

    reason: LossReason = "hung"


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


def die_with_parent(parent: int) -> None:
    """Linux: have the kernel SIGKILL this process when its parent's starting thread ends
    (and end now if the parent is already gone); elsewhere nothing (the pipe's EOF)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before the prctl took effect
        os._exit(1)


def child_main(
    config: ModelConfig,
    threads: int,
    trim_interval: float,
    conn: Connection,
    stop: Any,
    beat: Any,
    parent: int,
    warm: bool = True,
) -> None:
    """A child's whole life: load (and warm up, if `warm`), say Ready, then run batches
    until Close or EOF; after a batch, give the heap's free pages back once
    `trim_interval` seconds have passed since the last time, or once no batch has come for
    `IDLE_TRIM_S` (`trim_interval` 0: never). A batch's buffers leave ~100 MiB of free
    heap behind (tiny.en, 8 rooms): a worker left idle does not keep them until work comes."""
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="model worker %(process)d: %(message)s")
    try:
        recognizer = load_whisper(config)
        set_torch_threads(threads)  # after the load, which sets the loading thread's count
        if warm:
            recognizer.warmup()
    except Exception as exc:  # sent to the parent, which raises it
        conn.send(Failed(f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        return
    conn.send(Ready(recognizer.name, recognizer.languages))
    trim = malloc_trim() if trim_interval > 0 else None
    trimmed = time.monotonic()
    untrimmed = False  # a batch ran since the last trim

    def should_stop() -> bool:
        beat.value = time.monotonic()
        return bool(stop.value)

    while True:
        try:
            if trim is not None and untrimmed and not conn.poll(IDLE_TRIM_S):
                trim()
                trimmed, untrimmed = time.monotonic(), False
            message = conn.recv()
        except EOFError:  # the parent is gone
            return
        if isinstance(message, Close):
            return
        if not isinstance(message, Batch):
            conn.send(Failed(f"TypeError: unexpected message {message!r}", ""))
            continue
        beat.value = time.monotonic()
        try:
            reply: Done | Stopped | Failed = Done(
                recognizer.transcribe(message.utterances, should_stop)
            )
        except Interrupted:
            reply = Stopped()
        except Exception as exc:
            reply = Failed(f"{type(exc).__name__}: {exc}", traceback.format_exc())
        conn.send(reply)
        untrimmed = True
        if trim is not None and time.monotonic() - trimmed >= trim_interval:
            trim()
            trimmed, untrimmed = time.monotonic(), False


class ChildProcess:
    """One child process, its end of the pipe, its stop flag and its heartbeat."""

    def __init__(
        self, index: int, config: ModelConfig, threads: int, trim_interval: float, warm: bool
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self.index = index
        self.stop = context.RawValue(ctypes.c_bool, False)
        self.beat = context.RawValue(ctypes.c_double, time.monotonic())
        self.conn, child_conn = context.Pipe()
        shared = (self.stop, self.beat)
        self.process: SpawnProcess = context.Process(
            target=child_main,
            args=(config, threads, trim_interval, child_conn, *shared, os.getpid(), warm),
            name=f"parley-model-{index}",
            daemon=True,
        )
        self.process.start()
        child_conn.close()

    def run(
        self, utterances: list[Utterance], should_stop: StopCheck | None, hang_after: float
    ) -> list[Transcription]:
        """The child's transcriptions of `utterances`; WorkerLost if it dies or hangs.

        The batch is sent from a thread of its own: a batch is larger than the pipe's
        buffer, so sending it to a child that is not reading (stopped) would block this
        thread past any check; the child is declared hung instead, and killed, which ends
        the send (a broken pipe)."""
        self.stop.value = False
        self.beat.value = time.monotonic()
        failed: list[Exception] = []
        threading.Thread(
            target=self._send, args=(Batch(utterances), failed), name="parley-batch-send"
        ).start()
        stop_at: float | None = None
        while not self._poll():
            if failed or not self.process.is_alive():  # a send that failed: it is gone
                raise self._died()
            now = time.monotonic()
            if stop_at is None and should_stop is not None and should_stop():
                self.stop.value, stop_at = True, now
            quiet = now - self.beat.value
            if quiet > hang_after or (stop_at is not None and now - stop_at > STOP_GRACE_S):
                asked = "" if stop_at is None else f", a stop unanswered for {now - stop_at:.1f} s"
                raise WorkerProcessHung(
                    f"model worker process {self.index} hung"
                    f" (no heartbeat for {quiet:.1f} s{asked})"
                )
        try:
            reply = self.conn.recv()
        except (EOFError, OSError):
            raise self._died() from None
        if isinstance(reply, Done):
            return reply.transcriptions
        if isinstance(reply, Stopped):
            raise Interrupted("the batch was stopped")
        if isinstance(reply, Failed):
            logger.error("model worker process %d failed a batch:\n%s", self.index, reply.details)
            raise RuntimeError(reply.error)
        raise RuntimeError(f"model worker process {self.index} sent {reply!r}")

    def _poll(self) -> bool:
        """Whether a reply waits (within STOP_POLL_S); a pipe closed under the batch (its
        child was found dead and killed) is the child's death, not an OSError."""
        try:
            return self.conn.poll(STOP_POLL_S)
        except OSError:
            raise self._died() from None

    def _send(self, batch: Batch, failed: list[Exception]) -> None:
        try:
            self.conn.send(batch)
        except (OSError, TypeError, ValueError) as exc:  # it is gone (or killed: closed)
            failed.append(exc)

    def loaded(self) -> Ready | str | None:
        """Its first message if there is one: Ready, or why it failed to load (a str)."""
        try:
            if not self.conn.poll(0):
                return None if self.process.is_alive() else self._exit()
            reply = self.conn.recv()
        except (EOFError, OSError):
            return self._exit()
        if isinstance(reply, Ready):
            return reply
        return reply.error if isinstance(reply, Failed) else f"sent {reply!r} first"

    def _exit(self) -> str:
        self.process.join(1.0)
        return f"exited while loading (exit code {self.process.exitcode})"

    def _died(self) -> WorkerProcessDied:
        self.process.join(1.0)
        return WorkerProcessDied(
            f"model worker process {self.index} died (exit code {self.process.exitcode})"
        )

    def ask_to_close(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # already gone
            self.conn.send(Close())

    def kill(self) -> None:
        """SIGKILL (a stopped process ends too), reap, and close the pipe."""
        with contextlib.suppress(OSError, ValueError):
            self.process.kill()
        self.process.join(1.0)
        self.conn.close()
