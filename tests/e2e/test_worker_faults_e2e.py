"""The real server's model worker processes SIGKILLed and SIGSTOPped 3.5 s into a JFK
stream at real time (bench/workers_faults.py: the same runs, with the latency budgets).
Every final still arrives with the right text, the stream ends, /readyz is 200 again and
/metrics counts the restarts; and no worker outlives a server that is SIGKILLed."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import orjson
import pytest

from bench.workers_faults import SERVER_ENV, FaultRun, run_fault, worker_pids
from tests.support.servers import start_server

pytestmark = pytest.mark.slow

PATIENCE = 600.0


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_faulty_workers_lose_no_final_and_die_with_the_server() -> None:
    server = start_server(SERVER_ENV)
    try:
        pid = server.process.pid
        runs: list[FaultRun] = []
        for fault in ("kill-one", "kill-all", "stop-all"):
            # Patient: a replacement loads the model, minutes on a loaded 2-core box.
            run = asyncio.run(run_fault(server.http_url, pid, fault, f"f-{fault}", PATIENCE))
            runs.append(run)
            assert run.victims and run.ended, (run, server.log())
            assert run.finals and run.wer <= 0.1, run
            assert run.ready_after is not None, (run, server.log())
        kill_one, kill_all, stop_all = (run.restarts for run in runs)
        assert kill_one["died"] == 1 and kill_one["hung"] == 0, runs
        assert kill_all["died"] == 3 and stop_all["hung"] == 2, runs
        status, body = server.get("/readyz")
        assert status == 200 and orjson.loads(body)["checks"]["model_workers"] == "2/2"
        children = worker_pids(pid)
        assert len(children) == 2
        server.process.kill()
        server.process.wait()
        deadline = time.monotonic() + 30
        while any(alive(child) for child in children):
            assert time.monotonic() < deadline, "a model worker outlived the server"
            time.sleep(0.05)
    finally:
        server.stop()
