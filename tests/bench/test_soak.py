"""bench/soak's arithmetic and its wait for a round's streams to close."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest

from bench.processes import ServerProcess, status_kbs
from bench.soak import floor_slope, heap_reports, streams_closed


class Draining:
    """A server whose streams close one per /metrics read (the real one closes each a
    moment after its client's stop)."""

    def __init__(self, open_streams: int) -> None:
        self.open = open_streams
        self.reads = 0

    def active_sessions(self) -> int:
        self.reads += 1
        self.open = max(0, self.open - 1)
        return self.open


def test_the_between_rounds_sample_waits_for_the_streams_to_close() -> None:
    server = Draining(3)
    assert streams_closed(cast(ServerProcess, server), timeout_s=5.0)
    assert server.open == 0 and server.reads == 3


def test_a_stream_that_never_closes_is_waited_for_a_bounded_time() -> None:
    class Stuck(Draining):
        def active_sessions(self) -> int:
            return 1

    assert not streams_closed(cast(ServerProcess, Stuck(1)), timeout_s=0.6)


def test_floor_slope_is_percent_of_the_mean_per_hour() -> None:
    # 100 MiB rising 1 MiB an hour (1/60 a minute): ~1 % of the mean per hour.
    floors = {m: 100.0 + m / 60 for m in range(15, 75)}
    assert floor_slope(floors) == pytest.approx(100 / (100 + 44.5 / 60), rel=1e-6)
    assert floor_slope({1: 5.0, 2: 6.0}) != floor_slope({1: 5.0, 2: 6.0})  # NaN: too few


def test_rss_and_its_anonymous_part_come_from_one_read() -> None:
    rss, anon = status_kbs(os.getpid(), "VmRSS:", "RssAnon:")
    assert rss >= anon > 0
    with pytest.raises(RuntimeError, match="no Nope:"):
        status_kbs(os.getpid(), "VmRSS:", "Nope:")


SPAWNS_A_WORKER = """
import multiprocessing, time
if __name__ == "__main__":
    worker = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,))
    worker.start()
    print(worker.pid, flush=True)
    time.sleep(60)
"""


def test_the_servers_processes_are_named_by_kind_with_their_rss(tmp_path: Path) -> None:
    """A process that spawned a multiprocessing worker (as the server's model workers are
    started): `server` is it, `worker-PID` its child, each with an RSS."""
    started = subprocess.Popen([sys.executable, "-c", SPAWNS_A_WORKER], stdout=subprocess.PIPE)
    worker = 0
    try:
        assert started.stdout is not None
        with started.stdout:
            worker = int(started.stdout.readline())
        server = ServerProcess("server", {}, tmp_path / "server.log", started=started)
        pids = server.process_pids()
        assert pids["server"] == started.pid and pids[f"worker-{worker}"] == worker
        rss = server.process_rss_bytes()
        assert set(rss) <= set(pids) and {"server", f"worker-{worker}"} <= set(rss)
        assert all(v > 0 for v in rss.values())
    finally:
        if worker:
            os.kill(worker, signal.SIGKILL)
        started.kill()
        started.wait()


def test_heap_reports_are_read_from_where_the_log_was(tmp_path: Path) -> None:
    """`heap_report_now` reads the log from where it ended when it asked: an older report
    does not count."""
    log = tmp_path / "server.log"
    old = '{"level": "info", "message": "heap report", "python_blocks": 1}\n'
    log.write_text('{"message": "ready"}\n' + old)
    start = log.stat().st_size
    assert [r["python_blocks"] for r in heap_reports(log)] == [1]
    assert heap_reports(log, start) == []
    with log.open("a") as file:
        file.write(old.replace("1}", "2}") + 'not json "heap report"\n')
    assert [r["python_blocks"] for r in heap_reports(log, start)] == [2]
