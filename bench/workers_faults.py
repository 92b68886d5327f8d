"""`python -m bench.workers_faults`: model worker processes killed or hung mid-stream.

A real server (`python -m server`, two model worker processes, in-process store) is
streamed the JFK clip at real time (with a second of trailing silence); 3.5 s in, its
worker processes (found by a /proc scan of the server's children) get a signal:

- `kill-one`: SIGKILL to one worker;
- `kill-all`: SIGKILL to every worker;
- `stop-all`: SIGSTOP to every worker (a hang: alive, never answering).

For each it reports the finals (how many, WER of their text against the reference), the
worst final's delay after its audio was sent, how long until `/readyz` answered 200
again, the restarts `/metrics` counted, and whether the stream ended. Budgets (issue 32):
every final within 4 s (kill-one), 12 s (kill-all), 30 s (stop-all) of its audio, WER
<= 0.1, `/readyz` 200 again within 60 s; the exit status is 1 when one is missed.

`--faults` picks some; `--server-pid-file` is not needed: the server is started here.
Stopped workers left behind are killed at the end (an old server does not).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from bench.corpus import clips
from bench.processes import ServerProcess, http_get

BYTES_PER_SECOND = 32_000
FRAME_MS = 20
FAULT_AT_S = 3.5
READY_BUDGET_S = 60.0
FAULTS = {
    "kill-one": (signal.SIGKILL, 1),
    "kill-all": (signal.SIGKILL, 2),
    "stop-all": (signal.SIGSTOP, 2),
}
BUDGETS = {"kill-one": 4.0, "kill-all": 12.0, "stop-all": 30.0}
SERVER_ENV = {
    "PARLEY_MODEL_PROCESSES": "on",
    "PARLEY_MODEL_WORKERS": "2",
    "PARLEY_ADMIT_MAX_QUEUE_WAIT_MS": "0",
    "PARLEY_LOG_FORMAT": "text",
    "PYTHONUNBUFFERED": "1",
}


@dataclass
class FaultRun:
    fault: str
    victims: list[int] = field(default_factory=list)
    finals: list[str] = field(default_factory=list)
    delays: list[float] = field(default_factory=list)  # each final's, after its audio
    wer: float = 1.0
    ended: bool = False  # session.ended arrived (the stream was settled)
    ready_after: float | None = None  # seconds from the fault to /readyz 200
    restarts: dict[str, float] = field(default_factory=dict)

    def within(self) -> bool:
        return (
            self.ended
            and bool(self.finals)
            and self.wer <= 0.1
            and max(self.delays, default=0.0) <= BUDGETS[self.fault]
            and self.ready_after is not None
            and self.ready_after <= READY_BUDGET_S
        )


def worker_pids(server_pid: int) -> list[int]:
    """The server's model worker processes: its children started by multiprocessing's
    spawn (not its resource tracker)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        if ppid == server_pid and b"spawn_main" in cmdline:
            pids.append(int(entry.name))
    return sorted(pids)


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def wer(reference: str, hypothesis: str) -> float:
    ref, hyp = words(reference), words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        previous, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (r != h))
    return row[-1] / max(1, len(ref))


async def run_fault(
    server_url: str, server_pid: int, fault: str, meeting: str, patience: float = READY_BUDGET_S
) -> FaultRun:
    """Once every worker is up, stream JFK at real time, signal the workers `FAULT_AT_S`
    in, collect the finals; then wait (up to `patience` after the fault) for the stream's
    end and every worker up again, and read the restarts."""
    await whole(server_url, server_pid, patience)
    signum, count = FAULTS[fault]
    clip = clips(("en_jfk",))[0]
    audio = clip.audio()
    pcm = (audio * 32767).astype("<i2").tobytes() + bytes(BYTES_PER_SECOND)
    run = FaultRun(fault)
    faulted_at = 0.0
    times: list[float] = []
    probes: list[tuple[bool, bool]] = []  # (/readyz 200, every worker process up)
    poller: asyncio.Task[None] | None = None
    streamed = asyncio.Event()
    url = f"{server_url.replace('http', 'ws')}/v1/meetings/{meeting}/stream?participant=jfk"
    async with connect(url, max_size=None) as ws:
        started = time.monotonic()

        async def receive() -> None:
            with contextlib.suppress(ConnectionClosed):
                async for raw in ws:
                    message = orjson.loads(raw)
                    if message["type"] == "transcript.final":
                        run.finals.append(message["text"])
                        run.delays.append(time.monotonic() - (started + message["end"]))
                    elif message["type"] == "session.ended":
                        run.ended = True
                        return

        receiver = asyncio.create_task(receive())
        frame = BYTES_PER_SECOND * FRAME_MS // 1000
        for i, offset in enumerate(range(0, len(pcm), frame)):
            if not faulted_at and i * FRAME_MS / 1000 >= FAULT_AT_S:
                run.victims = worker_pids(server_pid)[:count]
                for pid in run.victims:
                    os.kill(pid, signum)
                faulted_at = time.monotonic()
                poller = asyncio.create_task(probe(server_url, server_pid, times, probes, streamed))
            await ws.send(pcm[offset : offset + frame])
            delay = started + (i + 1) * FRAME_MS / 1000 - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        await ws.send(orjson.dumps({"type": "stop"}).decode())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(receiver, patience)
    run.wer = wer(clip.reference, " ".join(run.finals))
    streamed.set()
    if poller is not None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(poller, max(0.0, faulted_at + patience - time.monotonic()))
    # Ready again: the first 200 after the last 503 (0: it never went unready).
    ready = [t for t, (ok, _) in zip(times, probes, strict=True) if ok]
    unready = [t for t, (ok, _) in zip(times, probes, strict=True) if not ok]
    if ready and (not unready or ready[-1] > unready[-1]):
        after = [t for t in ready if not unready or t > unready[-1]]
        run.ready_after = 0.0 if not unready else after[0] - faulted_at
    _, body = await asyncio.to_thread(http_get, server_url + "/metrics")
    for line in body.decode().splitlines():
        if line.startswith("parley_model_worker_restarts_total{"):
            reason = line.split('reason="')[1].split('"')[0]
            run.restarts[reason] = float(line.rpartition(" ")[2])
    return run


async def whole(server_url: str, server_pid: int, timeout: float) -> None:
    """Wait (up to `timeout`) until /readyz is 200 with every worker up."""
    times: list[float] = []
    probes: list[tuple[bool, bool]] = []
    done = asyncio.Event()
    done.set()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(probe(server_url, server_pid, times, probes, done), timeout)


async def probe(
    server_url: str,
    server_pid: int,
    times: list[float],
    probes: list[tuple[bool, bool]],
    streamed: asyncio.Event,
) -> None:
    """Every 0.2 s: whether /readyz answers 200, and whether both workers are up; until
    both hold after the stream ended."""
    while True:
        status, body = await asyncio.to_thread(http_get, server_url + "/readyz")
        times.append(time.monotonic())
        # Every worker up: /readyz says so where it can (a loading one is there, not up).
        up = orjson.loads(body).get("checks", {}).get("model_workers", "2/2") == "2/2"
        probes.append((status == 200, up and len(worker_pids(server_pid)) >= 2))
        if streamed.is_set() and probes[-1] == (True, True):
            return
        await asyncio.sleep(0.2)


def report(runs: Sequence[FaultRun]) -> str:
    lines = [
        "| fault | finals | WER | worst final after its audio | /readyz 200 after | restarts"
        " (cumulative) | ended | within budget |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        ready = "never" if run.ready_after is None else f"{run.ready_after:.1f} s"
        worst = f"{max(run.delays):.1f} s" if run.delays else "-"
        restarts = ", ".join(f"{k} {v:.0f}" for k, v in run.restarts.items()) or "none counted"
        lines.append(
            f"| {run.fault} | {len(run.finals)} | {run.wer:.2f} | {worst} | {ready} | {restarts}"
            f" | {run.ended} | {run.within()} (budget {BUDGETS[run.fault]:.0f} s) |"
        )
    return "\n".join(lines)


async def main_async(faults: Sequence[str], log: Path) -> list[FaultRun]:
    server = ServerProcess("server", SERVER_ENV, log)
    server.start()
    runs: list[FaultRun] = []
    try:
        for n, fault in enumerate(faults):
            runs.append(await run_fault(server.http_url, server.pid, fault, f"faults-{n}"))
            print(report(runs[-1:]).splitlines()[-1], flush=True)
            for pid in runs[-1].victims:  # an old server leaves stopped workers behind
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    finally:
        server.stop()
    return runs


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", nargs="+", choices=list(FAULTS), default=list(FAULTS))
    args = parser.parse_args(argv)
    log = Path(tempfile.mkstemp(prefix="workers-faults-", suffix=".log")[1])
    runs = asyncio.run(main_async(args.faults, log))
    print(report(runs))
    print(f"server log: {log}")
    sys.exit(0 if all(run.within() for run in runs) else 1)


if __name__ == "__main__":
    main()
