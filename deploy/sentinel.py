"""A Redis primary, its replica and three sentinels on loopback ports of their own: the
store's failover, as deploy/local.py starts it (and tests/e2e/test_sentinel.py and
bench/nodes.py kill its primary)."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from deploy.processes import end_process, free_port

SERVICE = "parley"
DOWN_AFTER_MS = 1000  # a primary silent this long is subjectively down
FAILOVER_TIMEOUT_MS = 5000


REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def _answers(port: int, command: bytes = b"PING\r\n") -> bytes:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.25) as sock:
            sock.sendall(command)
            return sock.recv(4096)
    except OSError:
        return b""


class Sentineled:
    """`start()` a primary, a replica of it and three sentinels monitoring it as
    `SERVICE` (quorum 2); `kill_primary()` SIGKILLs the primary; `wait_promoted()` returns
    once the sentinels name another one. `stop()` ends every process it started."""

    def __init__(self, workdir: Path, *, down_after_ms: int = DOWN_AFTER_MS) -> None:
        self.workdir = workdir
        self.down_after_ms = down_after_ms
        self.ports = {"primary": free_port(), "replica": free_port()}
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self, timeout: float = 30.0) -> None:
        primary, replica = self.ports["primary"], self.ports["replica"]
        self._redis("primary", primary)
        self._redis("replica", replica, "--replicaof", "127.0.0.1", str(primary))
        self._until(lambda: b"master_link_status:up" in self._info(replica), timeout, "replica")
        for i, port in enumerate(self.sentinel_ports):
            config = self.workdir / f"sentinel-{i}.conf"
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.workdir}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {primary} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}\n"
                f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
            self._spawn(f"sentinel-{i}", [REDIS_SERVER, str(config), "--sentinel"])
        for port in self.sentinel_ports:  # each sentinel sees the replica and the others
            self._until(lambda p=port: self._sentinels_ready(p), timeout, "sentinels")

    def _sentinels_ready(self, port: int) -> bool:
        info = _answers(port, f"SENTINEL MASTER {SERVICE}\r\n".encode())
        fields = info.split(b"\r\n")
        try:
            replicas = int(fields[fields.index(b"num-slaves") + 2])
            others = int(fields[fields.index(b"num-other-sentinels") + 2])
        except (ValueError, IndexError):
            return False
        return replicas >= 1 and others >= 2

    def primary_port(self) -> int | None:
        """The primary's port as the first sentinel that answers names it."""
        for port in self.sentinel_ports:
            reply = _answers(port, f"SENTINEL GET-MASTER-ADDR-BY-NAME {SERVICE}\r\n".encode())
            lines = reply.split(b"\r\n")
            if len(lines) >= 5 and lines[4].isdigit():
                return int(lines[4])
        return None

    def kill_primary(self) -> int:
        """SIGKILL the process that is primary now; its port."""
        port = self.primary_port()
        name = next(n for n, p in self.ports.items() if p == port)
        self._end(name, signal.SIGKILL)
        return port or 0

    def wait_promoted(self, old_port: int, timeout: float = 60.0) -> int:
        """Return once the sentinels name a primary other than `old_port`, that answers
        as one."""

        def promoted() -> bool:
            port = self.primary_port()
            return port not in (None, old_port) and b"role:master" in self._info(port or 0)

        self._until(promoted, timeout, "failover")
        return self.primary_port() or 0

    def stop(self) -> None:
        for name in list(self.processes):
            self._end(name, signal.SIGTERM)

    def _redis(self, name: str, port: int, *extra: str) -> None:
        self._spawn(
            name,
            [
                REDIS_SERVER,
                "--port", str(port),
                "--bind", "127.0.0.1",
                "--dir", str(self.workdir),
                "--dbfilename", f"{name}.rdb",
                "--save", "",
                "--appendonly", "no",
                *extra,
            ],
        )  # fmt: skip
        self._until(lambda: _answers(port).startswith(b"+PONG"), 10.0, name)

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - the child holds it
        with log:
            self.processes[name] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)

    def _end(self, name: str, signum: int) -> None:
        end_process(self.processes.pop(name), signum, 10)

    def _info(self, port: int) -> bytes:
        return _answers(port, b"INFO replication\r\n")

    def _until(self, check: object, timeout: float, what: str) -> None:
        assert callable(check)
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                logs = {p.name: p.read_text(errors="replace")[-2000:] for p in self._logs()}
                raise RuntimeError(f"{what} not ready within {timeout} s: {logs}")
            time.sleep(0.05)

    def _logs(self) -> list[Path]:
        return sorted(self.workdir.glob("*.log"))
