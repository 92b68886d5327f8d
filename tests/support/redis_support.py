"""Test support for the store: a redis-server the tests own, a clock they control."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
from pathlib import Path

from redis.asyncio import Redis

from deploy.processes import free_port as free_port  # the tests' one copy
from tests.support.timeouts import MS

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


async def delete_keys(redis_url: str, prefix: str) -> None:
    """Delete every key under `prefix` (a test's own)."""
    client = Redis.from_url(redis_url)
    try:
        keys = [key async for key in client.scan_iter(match=prefix + "*", count=1000)]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


def redis_answers(host: str, port: int) -> bool:
    """True if a Redis server answers PING at host:port."""
    try:
        with socket.create_connection((host, port), timeout=0.25) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """A redis-server process on its own port. `persistent` turns on an fsync-always AOF
    in `workdir`, so a SIGKILL loses nothing and a restart on the same port reloads it."""

    def __init__(self, workdir: Path, *, port: int | None = None, persistent: bool) -> None:
        self.port = port or free_port()
        self.workdir = workdir
        self.persistent = persistent
        self._process: subprocess.Popen[bytes] | None = None
        self._pump: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10_000 * MS) -> None:
        """Start the server and return once it accepts connections (dataset loaded)."""
        if not os.access(REDIS_SERVER, os.X_OK):
            raise RuntimeError(
                "redis-server not found: install the Debian package redis-server, or set "
                "PARLEY_TEST_REDIS_URL to a Redis the tests may use"
            )
        args = [
            REDIS_SERVER,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.workdir),
            "--save", "",
            "--logfile", "",
            "--daemonize", "no",
        ]  # fmt: skip
        if self.persistent:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        ready = threading.Event()
        log: list[bytes] = []

        def pump() -> None:  # read the log until the process exits, so the pipe never fills
            assert process.stdout is not None
            for line in process.stdout:
                log.append(line)
                if b"Ready to accept connections" in line:
                    ready.set()

        self._pump = threading.Thread(target=pump, daemon=True)
        self._pump.start()
        self._process = process
        if not ready.wait(timeout):
            self.kill()
            raise RuntimeError("redis-server did not start:\n" + b"".join(log).decode())

    def kill(self) -> None:
        """SIGKILL: the crash case."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        self._signal(signal.SIGTERM)

    def _signal(self, signum: int) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signum)
        process.wait()
        if self._pump is not None:
            self._pump.join()  # EOF once the process is gone
        assert process.stdout is not None
        process.stdout.close()


class ManualClock:
    """The store's clock, moved by hand."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
