"""Soak benchmark: rooms of real-time speech for a long time; does anything grow?

    python -m bench.soak                                   # 8 rooms, 30 min, real model
    python -m bench.soak --rooms 8 --minutes 30 --engine fake   # everything but the model
    python -m bench.soak --minutes 60 --heap-between-rounds     # what each round left behind

Starts a redis-server of its own and `python -m server` (or `bench.fake_server`, whose
stand-in model sleeps instead of computing) on the Redis store with a short meeting TTL
(`PARLEY_MEETING_TTL_S`), then runs the load generator (`python -m loadgen`) for
`--minutes` of conversation per room, in back-to-back rounds of at most 10 minutes (new
meetings each round: meetings come and go as in production). Every 10 s it samples the
server's RSS, open file descriptors, asyncio tasks (`parley_event_loop_tasks`) and the
Redis key count; every `FLOOR_SAMPLE_S`, each process's RSS and its anonymous part, kept
as each minute's lowest. A model worker gives its free heap pages back once a minute (and
after 5 s idle) and takes ~100 MiB of them again within its next batch or two: a floor from
a sample every 10 s mostly missed that moment and swung ±35 MiB, and one every 2 s still
±50 MiB (tiny.en, 8 rooms). At the end it waits for every meeting to expire and counts the
keys left. After each round, once no stream is open (`parley_active_sessions` 0), it
samples the server's heaps once more (`server_heap_between_rounds`): what a round left
behind, without tracing's own cost.

Printed (and written to `REPORT_DIR/soak.json`): the RSS slope after the warm-up (the
first `--warmup-minutes`), as % of the mean RSS per hour, from a least-squares line, and
the same for the RSS's anonymous part (`RssAnon`: heap, allocator arenas, stacks; the
file-backed rest is library and model pages, touched lazily as code paths first run,
which rises in steps bounded by the files); the tasks, descriptors and keys while idle
before the load and idle after expiry, with the store's Redis connections counted apart
(its pools keep what the busiest moment opened: bounded by peak concurrency, not time);
and the load generator's lost and duplicated finals. Targets: RSS slope ≤ 0.1 %/h, no
growth in tasks, descriptors or keys (docs/performance.md#long-runs-memory).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.processes import RedisProcess, ServerProcess, status_kbs

ROUND_MINUTES = 10.0
FLOOR_SAMPLE_S = 0.1  # each process's RSS for its minute floors (one /proc read each)
FLOOR_LIST_S = 10.0  # the server's child processes, listed again
CLOSE_WAIT_S = 30.0  # after a round, for the server's sessions to end
HEAP_FIELDS = ("python_blocks", "malloc_in_use_mb", "malloc_free_mb")  # `Sample`'s heaps


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # seconds since the load started
    rss_mb: float
    anon_mb: float  # of `rss_mb`: anonymous memory (heap, arenas, stacks)
    fds: int
    redis_fds: int  # of `fds`: the store's connections to Redis (its pools)
    tasks: int
    keys: int
    processes: dict[str, float]  # RSS in MiB by process: `server`, `worker-PID`, `other-PID`
    # The server process's heaps (`engine.memory.heap_usage`, from /metrics): a leak grows
    # what is in use, fragmentation what malloc keeps free.
    python_blocks: int
    malloc_in_use_mb: float
    malloc_free_mb: float


def redis_keys(redis: RedisProcess) -> int:
    out = subprocess.run(
        ["redis-cli", "-p", str(redis.port), "DBSIZE"], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip())


def sample(server: ServerProcess, redis: RedisProcess, started: float) -> Sample:
    # Descriptors first: the /metrics request's own connection is not counted.
    fds, redis_fds = server.open_fds(), server.fd_kinds(redis.port)["redis"]
    metrics = server.metrics()
    return Sample(
        at=round(time.monotonic() - started, 1),
        rss_mb=round(server.rss_bytes() / 2**20, 2),
        anon_mb=round(server.rss_anon_bytes() / 2**20, 2),
        fds=fds,
        redis_fds=redis_fds,
        tasks=int(metrics.get("parley_event_loop_tasks", -1)),
        keys=redis_keys(redis),
        processes={k: round(v / 2**20, 2) for k, v in server.process_rss_bytes().items()},
        python_blocks=int(metrics.get("parley_python_allocated_blocks", -1)),
        malloc_in_use_mb=round(metrics.get('parley_malloc_bytes{kind="in_use"}', -1) / 2**20, 2),
        malloc_free_mb=round(metrics.get('parley_malloc_bytes{kind="free"}', -1) / 2**20, 2),
    )


def slope_percent_per_hour(samples: list[Sample], warmup_s: float, field: str = "rss_mb") -> float:
    """Least-squares slope of `field` after the warm-up, as % of its mean per hour."""
    kept = [s for s in samples if s.at >= warmup_s]
    if len(kept) < 3:
        return float("nan")
    t = np.array([s.at for s in kept]) / 3600.0
    rss = np.array([getattr(s, field) for s in kept])
    slope = float(np.polyfit(t, rss, 1)[0])
    return 100.0 * slope / float(rss.mean())


class MinuteFloors:
    """Each process's lowest RSS (and lowest anonymous RSS) in each minute of the load,
    in MiB, from a sample every `FLOOR_SAMPLE_S`: `rss[name][minute]`, `anon[name][minute]`.
    The processes are listed again every `FLOOR_LIST_S` (a restarted worker is a new one)."""

    def __init__(self, server: ServerProcess) -> None:
        self.rss: dict[str, dict[int, float]] = {}
        self.anon: dict[str, dict[int, float]] = {}
        self._server = server
        self._pids: dict[str, int] = {}
        self._listed = -FLOOR_LIST_S

    def add(self, started: float) -> None:
        now = time.monotonic()
        if now - self._listed >= FLOOR_LIST_S:
            self._pids, self._listed = self._server.process_pids(), now
        minute = int((now - started) // 60)
        for name, pid in self._pids.items():
            try:
                rss, anon = (kb * 1024 for kb in status_kbs(pid, "VmRSS:", "RssAnon:"))
            except (OSError, RuntimeError):
                continue  # gone meanwhile
            for floors, value in ((self.rss, rss), (self.anon, anon)):
                kept = floors.setdefault(name, {})
                mib = round(value / 2**20, 2)
                kept[minute] = min(mib, kept.get(minute, mib))


def minute_floor_slopes(
    floors: dict[str, dict[int, float]], warmup_s: float
) -> dict[str, dict[str, float]]:
    """Per process: the least-squares slope of each minute's lowest value after the
    warm-up, as % of its mean per hour (a minute's floor leaves out the buffers of the
    decode in flight), and that floor at the first and the last minute after the warm-up."""
    slopes: dict[str, dict[str, float]] = {}
    for name, every_minute in floors.items():
        by_minute = {m: mib for m, mib in every_minute.items() if m * 60 >= warmup_s}
        if len(by_minute) < 3:
            continue  # a process that lived a moment (a decoder, a restarted worker)
        minutes = sorted(by_minute)
        slopes[name] = {
            "percent_per_hour": round(floor_slope(by_minute), 3),
            "first_mib": by_minute[minutes[0]],
            "last_mib": by_minute[minutes[-1]],
            "minutes": float(len(minutes)),
        }
    return slopes


def floor_slope(by_minute: dict[int, float]) -> float:
    """The least-squares slope of minute floors (MiB by minute), as % of their mean per
    hour; NaN for fewer than three minutes."""
    if len(by_minute) < 3:
        return float("nan")
    minutes = sorted(by_minute)
    floor = np.array([by_minute[m] for m in minutes])
    slope = float(np.polyfit(np.array(minutes) / 60.0, floor, 1)[0])
    return 100.0 * slope / float(floor.mean())


def streams_closed(server: ServerProcess, timeout_s: float = CLOSE_WAIT_S) -> bool:
    """Wait until the server has no stream open (`parley_active_sessions` 0: a stream's
    session ends a moment after its client's `stop`, once its last final is sent); whether
    that came within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.active_sessions() == 0:
            return True
        time.sleep(0.5)
    return False


def heap_reports(log: Path, start: int = 0) -> list[dict[str, Any]]:
    """The server's `heap report` lines (server/heap_report.py) from byte `start` of its
    log on, oldest first."""
    with log.open("rb") as file:
        file.seek(start)
        text = file.read().decode(errors="replace")
    reports = []
    for line in text.splitlines():
        if '"heap report"' not in line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        reports.append({k: v for k, v in entry.items() if k not in ("level", "logger", "message")})
    return reports


def heap_report_now(server: ServerProcess, log: Path, timeout_s: float = 600.0) -> bool:
    """Ask the server for a heap report (SIGUSR1) and wait until its log has it (read from
    where the log ended when asked); whether it came in time."""
    start = log.stat().st_size
    os.kill(server.pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(2.0)
        if heap_reports(log, start):
            return True
    return False


def load_rounds(
    args: argparse.Namespace,
    server: ServerProcess,
    report_dir: Path,
    after_round: Callable[[], None],
) -> list[dict[str, Any]]:
    """Run the load generator in rounds, calling `after_round` after each (its streams all
    closed); the totals of each round's report."""
    totals: list[dict[str, Any]] = []
    left = args.minutes
    index = 0
    while left > 0:
        minutes = min(ROUND_MINUTES, left)
        out = report_dir / f"round-{index}"
        command = [
            sys.executable, "-m", "loadgen",
            "--rooms", str(args.rooms), "--duration", str(minutes * 60),
            "--server", server.ws_url, "--seed", str(index),
            "--no-progress", "--report-dir", str(out),
        ]  # fmt: skip
        subprocess.run(command, check=False, stdout=subprocess.DEVNULL)
        report = json.loads((out / "report.json").read_text())
        totals.append(report["totals"] | {"errors": report.get("errors", {})})
        print(f"round {index}: {minutes:.1f} min, totals {totals[-1]}", flush=True)
        after_round()
        left -= minutes
        index += 1
    return totals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rooms", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--warmup-minutes", type=float, default=15.0)
    parser.add_argument("--ttl-s", type=float, default=60.0, help="meeting TTL for the run")
    parser.add_argument("--engine", choices=["model", "fake"], default="model")
    parser.add_argument("--report-dir", type=Path, default=Path("reports/soak"))
    parser.add_argument(
        "--heap-every-minutes",
        type=float,
        default=0.0,
        help="run the server with tracemalloc and log a heap report this often (0, the "
        "default: off); each report stalls the server's event loop (server/heap_report.py), "
        "so use them to find what grows, in a run whose losses and latency you do not report",
    )
    parser.add_argument(
        "--heap-between-rounds",
        action="store_true",
        help="run the server with tracemalloc and take a heap report after each round, "
        "when no stream is open (the next round waits for it): what one report gained over "
        "the previous is what a round left behind",
    )
    args = parser.parse_args(argv)
    args.report_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="parley-soak-") as tmp:
        redis = RedisProcess(Path(tmp) / "redis", persistent=False)
        redis.start()
        server = ServerProcess(
            "server" if args.engine == "model" else "bench.fake_server",
            {"PARLEY_REDIS_URL": redis.url, "PARLEY_MEETING_TTL_S": str(args.ttl_s)}
            | (
                {"PYTHONTRACEMALLOC": "1"}
                if args.heap_every_minutes > 0 or args.heap_between_rounds
                else {}
            ),
            args.report_dir / "server.log",
        )
        server.start()
        started = time.monotonic()
        idle_before = sample(server, redis, started)
        samples: list[Sample] = []
        missed: list[str] = []  # samples that failed (the server too busy to answer)
        done = threading.Event()

        def sampler() -> None:
            next_heap_report = 0.0
            while not done.wait(10.0):
                try:
                    samples.append(sample(server, redis, started))
                except (OSError, RuntimeError, ValueError) as exc:  # a /metrics timeout
                    missed.append(f"{time.monotonic() - started:.0f} s: {exc!r}")
                    continue
                if args.heap_every_minutes > 0 and samples[-1].at >= next_heap_report:
                    os.kill(server.pid, signal.SIGUSR1)
                    next_heap_report = samples[-1].at + 60 * args.heap_every_minutes

        floors = MinuteFloors(server)

        def floor_sampler() -> None:
            while not done.wait(FLOOR_SAMPLE_S):
                floors.add(started)

        between_rounds: list[Sample] = []  # the server's heaps with no stream open

        def after_round() -> None:  # the load generator is done: its streams close
            streams_closed(server)
            between_rounds.append(sample(server, redis, started))
            if args.heap_between_rounds and not heap_report_now(
                server, args.report_dir / "server.log"
            ):
                print("no heap report came within 10 minutes", flush=True)

        thread = threading.Thread(target=sampler, daemon=True)
        thread.start()
        floor_thread = threading.Thread(target=floor_sampler, daemon=True)
        floor_thread.start()
        try:
            totals = load_rounds(args, server, args.report_dir, after_round)
            at_end = sample(server, redis, started)
            done.set()
            thread.join()
            floor_thread.join()
            deadline = time.monotonic() + 3 * args.ttl_s + 30.0
            while redis_keys(redis) > 0 and time.monotonic() < deadline:
                time.sleep(5.0)
            expired = sample(server, redis, started)
        finally:
            done.set()
            server.stop()
            redis.stop()
    result = {
        "rooms": args.rooms,
        "minutes": args.minutes,
        "engine": args.engine,
        "warmup_minutes": args.warmup_minutes,
        # The measure: per process, the slope of each minute's lowest RSS; then
        # the same for the anonymous part alone (what a leak grows).
        "minute_floor_slopes": minute_floor_slopes(floors.rss, args.warmup_minutes * 60),
        "minute_floor_anon_slopes": minute_floor_slopes(floors.anon, args.warmup_minutes * 60),
        "rss_slope_percent_per_hour": round(
            slope_percent_per_hour(samples, args.warmup_minutes * 60), 3
        ),
        # The anonymous part alone: file-backed pages (libraries, model files) rise in
        # bounded steps as code paths first run and say nothing about leaks.
        "anon_slope_percent_per_hour": round(
            slope_percent_per_hour(samples, args.warmup_minutes * 60, "anon_mb"), 3
        ),
        "anon_mb": {
            "idle_before": idle_before.anon_mb,
            "end_of_load": at_end.anon_mb,
            "idle_after": expired.anon_mb,
        },
        # Where the server's anonymous memory went: Python's objects, what malloc has handed
        # out, what it keeps free. Idle before and after: what the run left behind.
        "server_heap": {
            field: {
                "idle_before": getattr(idle_before, field),
                "end_of_load": getattr(at_end, field),
                "idle_after": getattr(expired, field),
                "slope_percent_per_hour": round(
                    slope_percent_per_hour(samples, args.warmup_minutes * 60, field), 3
                ),
            }
            for field in HEAP_FIELDS
        },
        # The same after each round, no stream open, without tracing: what a round left.
        "server_heap_between_rounds": [
            {"at": s.at, "anon_mb": s.anon_mb} | {field: getattr(s, field) for field in HEAP_FIELDS}
            for s in between_rounds
        ],
        "rss_mb": {
            "idle_before": idle_before.rss_mb,
            "end_of_load": at_end.rss_mb,
            "max": max(s.rss_mb for s in samples),
        },
        # Idle before the load and idle after every meeting expired: a leak shows as a rise.
        "tasks": {"idle_before": idle_before.tasks, "idle_after": expired.tasks},
        "fds": {"idle_before": idle_before.fds, "idle_after": expired.fds},
        # The store's Redis pools keep the connections the busiest moment opened (redis-py
        # closes none while they are healthy): bounded by the peak of concurrent commands,
        # not by time. A leak of descriptors shows in the others, or as Redis connections
        # idle after the load beyond the most it ever had open during it.
        "fds_besides_redis": {
            "idle_before": idle_before.fds - idle_before.redis_fds,
            "idle_after": expired.fds - expired.redis_fds,
        },
        "redis_connections": {
            "idle_before": idle_before.redis_fds,
            "peak": max(s.redis_fds for s in samples),
            "idle_after": expired.redis_fds,
        },
        "redis_keys": {
            "idle_before": idle_before.keys,
            "peak": max(s.keys for s in samples),
            "after_expiry": expired.keys,
        },
        "lost": sum(t.get("lost", 0) for t in totals),
        "duplicates": sum(t.get("duplicates", 0) for t in totals),
        "finals": sum(t.get("finals", 0) for t in totals),
        "rounds": totals,
        "missed_samples": missed,
        "heap_reports": heap_reports(args.report_dir / "server.log"),
        "samples": [asdict(s) for s in samples],
        "minute_floors": {"rss_mib": floors.rss, "anon_mib": floors.anon},
    }
    (args.report_dir / "soak.json").write_text(json.dumps(result, indent=2))
    shown = {k: v for k, v in result.items() if k not in ("samples", "rounds", "heap_reports")}
    print(json.dumps(shown, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
