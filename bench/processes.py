"""The processes a fault or soak benchmark drives: a Parley server it can stop, kill and
restart on the same port, and a redis-server of its own it can kill and restart."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from deploy.local import http_get as http_get  # one copy of each, for bench/ too
from deploy.processes import end_process
from deploy.processes import free_port as free_port

REPO = Path(__file__).resolve().parent.parent


@dataclass
class ServerProcess:
    """`python -m <module> --port PORT` (module: `server`, or `bench.fake_server`)."""

    module: str
    env: dict[str, str]
    log_path: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout: float = 300.0) -> None:
        """Start and wait until /readyz says ready."""
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", self.module, "--port", str(self.port)],
                cwd=REPO,
                env={**os.environ, **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.starts += 1
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}")
            try:
                if http_get(self.http_url + "/readyz", 2.0)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError("server not ready in time")

    def stop(self, timeout: float = 60.0) -> None:
        self._signal(signal.SIGTERM, timeout)

    def kill(self) -> None:
        self._signal(signal.SIGKILL, 30.0)

    def _signal(self, signum: int, timeout: float) -> None:
        process, self.process = self.process, None
        if process is not None:
            end_process(process, signum, timeout)

    def metrics(self) -> dict[str, float]:
        """/metrics as {sample line's name and labels: value}."""
        _, body = http_get(self.http_url + "/metrics")
        samples: dict[str, float] = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def rss_anon_bytes(self) -> int:
        """The anonymous part of the RSS (heap, arenas, stacks): what a leak grows. The
        rest is file-backed (pages of the mapped libraries and model files, touched
        lazily as code paths first run): it rises in steps, bounded by the files' size."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no RssAnon")

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def fd_kinds(self, redis_port: int) -> dict[str, int]:
        """The open descriptors by kind: `redis` (TCP connections to `redis_port`: the
        store's connection pools), `clients` (TCP connections to the server's port),
        `listen`, `other` (files, pipes, the event loop's epoll, other sockets)."""
        tcp = _tcp_sockets(self.pid)
        kinds = dict.fromkeys(("redis", "clients", "listen", "other"), 0)
        for fd in os.listdir(f"/proc/{self.pid}/fd"):
            try:
                target = os.readlink(f"/proc/{self.pid}/fd/{fd}")
            except OSError:
                continue  # closed meanwhile
            inode = target[len("socket:[") : -1] if target.startswith("socket:[") else ""
            local, remote, state = tcp.get(inode, (0, 0, ""))
            if state == "0A":  # TCP_LISTEN
                kinds["listen"] += 1
            elif inode in tcp and remote == redis_port:
                kinds["redis"] += 1
            elif inode in tcp and local == self.port:
                kinds["clients"] += 1
            else:
                kinds["other"] += 1
        return kinds


def _tcp_sockets(pid: int) -> dict[str, tuple[int, int, str]]:
    """{inode: (local port, remote port, state)} of the TCP sockets `pid` can see."""
    sockets: dict[str, tuple[int, int, str]] = {}
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
            for line in lines:
                fields = line.split()
                local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
                sockets[inode] = (int(local.rsplit(":", 1)[1], 16),
                                  int(remote.rsplit(":", 1)[1], 16), state)  # fmt: skip
    return sockets


@dataclass
class RedisProcess:
    """A redis-server on its own port; `persistent`: AOF with fsync on every write, so a
    kill loses nothing and a restart reloads it."""

    workdir: Path
    persistent: bool = True
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 20.0) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        args = [
            binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.workdir),
            "--save", "",
            "--appendonly", "yes" if self.persistent else "no",
            "--appendfsync", "always",
            "--logfile", str(self.workdir / "redis.log"),
        ]  # fmt: skip
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError("redis-server did not start")

    def kill(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            process.send_signal(signal.SIGKILL)
            process.wait()

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            process.terminate()
            process.wait()
