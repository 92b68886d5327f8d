"""Capacity benchmark: start a server with the given settings, then search for the most
concurrent real-time rooms whose final-latency P95 stays within the SLO.

    python -m bench.capacity --slo-p95 1.2 --duration 40 PARLEY_TORCH_THREADS=1

Each KEY=VALUE argument is a server environment variable, so one command measures one
configuration; the printed line and the loadgen report are what docs/performance.md
records. Run it on an otherwise idle machine: the server and the load generator share it.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_ready(url: str, process: subprocess.Popen[bytes], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("server not ready in time")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("settings", nargs="*", help="KEY=VALUE server environment variables")
    parser.add_argument("--slo-p95", type=float, default=1.2)
    parser.add_argument("--duration", type=float, default=40.0)
    parser.add_argument("--rooms", type=int, default=4, help="first trial's room count")
    parser.add_argument("--max-rooms", type=int, default=128)
    parser.add_argument("--search-budget", type=float, default=900.0)
    parser.add_argument("--report-dir", default="reports/capacity")
    args = parser.parse_args()
    env = dict(os.environ, PARLEY_LOG_LEVEL="warning")
    for item in args.settings:
        key, _, value = item.partition("=")
        env[key] = value
    port = free_port()
    Path(args.report_dir).parent.mkdir(parents=True, exist_ok=True)
    log = open(Path(args.report_dir).with_suffix(".server.log"), "wb")  # noqa: SIM115
    server = subprocess.Popen(
        [sys.executable, "-m", "server", "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}", server)
        command = [
            sys.executable,
            "-m",
            "loadgen",
            "--server",
            f"ws://127.0.0.1:{port}",
            "--find-max-rooms",
            "--slo-p95",
            str(args.slo_p95),
            "--rooms",
            str(args.rooms),
            "--duration",
            str(args.duration),
            "--max-rooms",
            str(args.max_rooms),
            "--search-budget",
            str(args.search_budget),
            "--report-dir",
            args.report_dir,
            "--no-progress",
        ]
        print("settings:", " ".join(args.settings) or "(defaults)", flush=True)
        return subprocess.run(command, cwd=REPO, check=False).returncode
    finally:
        server.terminate()
        server.wait(60)
        log.close()


if __name__ == "__main__":
    sys.exit(main())
