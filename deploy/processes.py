"""Child processes of the local deployment, the benches and the tests: a free loopback port
for one, its end, and the one harness of a Parley server under test (`ServerProcess`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 300.0  # a first start converts the bundled weights


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def end_process(
    process: subprocess.Popen[Any], signum: int = signal.SIGTERM, timeout: float = 30.0
) -> int | None:
    """Send `signum` to `process` if it still runs, give it `timeout` seconds to exit, then
    SIGKILL it; reaped either way. Its exit status."""
    if process.poll() is None:
        process.send_signal(signum)  # a child gone meanwhile is no error (Popen checks)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body) of a GET; an HTTP error status is an answer, not an exception."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@dataclass
class ServerProcess:
    """`python -m <module> --port PORT` run from `cwd` (module: `server`, or
    `bench.fake_server`), its output appended to `log_path`; it can be stopped, killed
    and started again on the same port. The tests, the benches and deploy/local.py's
    nodes are all this."""

    module: str
    env: dict[str, str]
    log_path: Path
    port: int = field(default_factory=free_port)
    cwd: Path = REPO
    started: subprocess.Popen[bytes] | None = None  # the latest start, kept once it ended
    starts: int = 0

    @property
    def name(self) -> str:
        return self.log_path.stem

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    @property
    def process(self) -> subprocess.Popen[bytes]:
        assert self.started is not None, f"{self.name} was never started"
        return self.started

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.started is not None and self.started.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
        return http_get(self.http_url + path, timeout)

    def spawn(self) -> None:
        """Start the process; return at once (`wait_ready` waits for it)."""
        with self.log_path.open("ab") as log:
            self.started = subprocess.Popen(
                [sys.executable, "-m", self.module, "--port", str(self.port)],
                cwd=self.cwd,
                env={**os.environ, **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.starts += 1

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        """Until /readyz says 200; raises at once if the process exits or its model fails."""
        deadline = time.monotonic() + timeout
        delay = 0.05  # growing to 0.5 s: a loading server's /readyz answers cost it CPU
        while True:
            if not self.alive:
                raise RuntimeError(
                    f"{self.name} exited with {self.process.returncode}:\n{self.log()[-4000:]}"
                )
            try:
                status, body = self.get("/readyz", 2.0)
                if status == 200:
                    return
                if b'"model":"failed"' in body:
                    raise RuntimeError(f"model failed to load: {body!r}\n{self.log()[-4000:]}")
            except (OSError, ConnectionError):  # not listening yet (URLError is an OSError)
                pass
            if time.monotonic() > deadline:
                tail = self.log()[-4000:]
                raise TimeoutError(f"{self.name} not ready after {timeout} s:\n{tail}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Spawn and wait until ready; a start that fails leaves no process behind."""
        self.spawn()
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.kill()
            raise

    def end(self, signum: int = signal.SIGTERM, timeout: float = 60.0) -> int | None:
        """`signum`, `timeout` seconds to exit, then SIGKILL (end_process); its exit status,
        None if it never started."""
        return None if self.started is None else end_process(self.started, signum, timeout)

    def stop(self, timeout: float = 60.0) -> int | None:
        return self.end(signal.SIGTERM, timeout)

    def kill(self) -> None:
        self.end(signal.SIGKILL, 30.0)

    def metrics(self) -> dict[str, float]:
        """/metrics as {sample line's name and labels: value}."""
        _, body = self.get("/metrics")
        samples: dict[str, float] = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples

    def active_sessions(self) -> int:
        """Open streams, from /metrics."""
        return int(self.metrics().get("parley_active_sessions", 0))
