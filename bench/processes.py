"""The processes a fault or soak benchmark drives: a Parley server it can stop, kill and
restart on the same port (deploy/processes.py's, with what a soak reads of it), and a
redis-server of its own it can kill and restart."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from deploy import processes
from deploy.processes import free_port as free_port  # one copy of each, for bench/ too
from deploy.processes import http_get as http_get


class ServerProcess(processes.ServerProcess):
    """deploy/processes.py's server under test (`python -m <module> --port PORT`: start,
    stop, kill, restart on the same port, /metrics), and what a soak reads of its
    process: memory and descriptors."""

    def rss_bytes(self) -> int:
        return status_kb(self.pid, "VmRSS:") * 1024

    def rss_anon_bytes(self) -> int:
        """The anonymous part of the RSS (heap, arenas, stacks): what a leak grows. The
        rest is file-backed (pages of the mapped libraries and model files, touched
        lazily as code paths first run): it rises in steps, bounded by the files' size."""
        return status_kb(self.pid, "RssAnon:") * 1024

    def process_pids(self) -> dict[str, int]:
        """The server and each process it started, by name, with its pid: `server`, and
        `worker-PID` for a model or speaker worker (multiprocessing's spawned children),
        `other-PID` for anything else (multiprocessing's resource tracker, a decoder)."""
        pids = {"server": self.pid}
        for child in _children(self.pid):
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue  # gone meanwhile
            kind = "worker" if b"spawn_main" in cmdline else "other"
            pids[f"{kind}-{child}"] = child
        return pids

    def process_rss_bytes(self) -> dict[str, int]:
        """The RSS of each of `process_pids`' processes, by name."""
        rss = {"server": self.rss_bytes()}
        for name, pid in self.process_pids().items():
            if name == "server":
                continue
            try:
                rss[name] = status_kb(pid, "VmRSS:") * 1024
            except (OSError, RuntimeError):
                continue  # gone meanwhile
        return rss

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


def _children(pid: int) -> list[int]:
    """The direct children of `pid` (of any of its threads)."""
    children: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            listed = Path(f"/proc/{pid}/task/{task}/children").read_text()
            children += [int(child) for child in listed.split()]
    return sorted(set(children))


def status_kb(pid: int, field: str) -> int:
    """A kB field of /proc/PID/status (`VmRSS:`, `RssAnon:`)."""
    (kb,) = status_kbs(pid, field)
    return kb


def status_kbs(pid: int, *fields: str) -> tuple[int, ...]:
    """kB fields of /proc/PID/status, from one read (one moment)."""
    found: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        parts = line.split()
        if parts and parts[0] in fields:
            found[parts[0]] = int(parts[1])
    missing = [field for field in fields if field not in found]
    if missing:
        raise RuntimeError(f"no {', '.join(missing)}")
    return tuple(found[field] for field in fields)


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
