"""Shared fixtures: a real Parley server (subprocess, real model), Redis, the corpus."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.corpus import REPO

START_TIMEOUT = 300.0  # first run converts the bundled weights


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class ServerProcess:
    """A `python -m server` subprocess on a free loopback port."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.http_url + path, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        delay = 0.05
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log()}")
            try:
                status, _ = self.get("/readyz")
                if status == 200:
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.log()}")

    def stop(self, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def start_server(
    env: dict[str, str] | None = None, *, wait: bool = True, port: int | None = None
) -> ServerProcess:
    port = port or free_port()
    log_file = tempfile.NamedTemporaryFile(  # noqa: SIM115 - lives as long as the server
        prefix=f"parley-{port}-", suffix=".log", delete=False
    )
    full_env = {
        **os.environ,
        "PARLEY_LOG_FORMAT": "text",
        "PARLEY_STATIC_DIR": str(REPO / "static"),
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "server", "--port", str(port)],
        cwd=REPO,
        env=full_env,
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    server = ServerProcess(process, port, Path(log_file.name))
    if wait:
        try:
            server.wait_ready()
        except BaseException:
            server.stop()
            raise
    return server


@pytest.fixture(scope="session")
def parley_server() -> Iterator[ServerProcess]:
    """One real server (real model, in-process store) shared by the end-to-end tests."""
    server = start_server()
    yield server
    server.stop()


def _redis_answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """PARLEY_TEST_REDIS_URL, else the local Redis on 6379, else a redis-server we start."""
    if url := os.environ.get("PARLEY_TEST_REDIS_URL"):
        yield url
        return
    if _redis_answers("127.0.0.1", 6379):
        yield "redis://127.0.0.1:6379/0"
        return
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("no Redis answers on 127.0.0.1:6379 and redis-server is not installed")
    port = free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while not _redis_answers("127.0.0.1", port):
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail("redis-server did not start")
        time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0"
    process.terminate()
    process.wait(10)
