"""HAProxy in front of Parley nodes: the configuration docs/operations.md describes
(WebSocket in `mode http`, `balance leastconn`, health checks on `/readyz`, the client's
address in `X-Forwarded-For`), and a process that runs it in the foreground."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from deploy.processes import end_process

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
CHECK_INTER_MS = 1000  # a node is checked this often; down after FALL failed checks
FALL = 2
RISE = 2


def config(bind: str, port: int, nodes: list[tuple[str, int]]) -> str:
    """haproxy.cfg for `nodes` (host, port) behind `bind:port`.

    - `timeout tunnel 1h`: an upgraded WebSocket lives this long without traffic (a
      stream sends audio every 20-100 ms; a listener may idle between meetings).
    - `option redispatch` + `retries`: a connection that fails to reach a node (killed,
      not yet marked down) is retried on another, so a resume after a crash lands on a
      survivor at once.
    - `on-marked-down shutdown-sessions` is left out on purpose: a node marked down
      because it is full or draining (503 on /readyz) keeps its open streams.
    """
    servers = "\n".join(
        f"    server node{i} {host}:{node_port} check" for i, (host, node_port) in enumerate(nodes)
    )
    return f"""\
global
    maxconn 4000

defaults
    mode http
    option forwardfor
    option redispatch
    retries 3
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    timeout tunnel 1h
    timeout http-request 10s
    timeout client-fin 5s

frontend parley
    bind {bind}:{port}
    default_backend nodes

backend nodes
    balance leastconn
    option httpchk GET /readyz
    http-check expect status 200
    default-server inter {CHECK_INTER_MS} fall {FALL} rise {RISE}
{servers}
"""


class HAProxy:
    """`start()` haproxy on `config`; returns once it accepts connections."""

    def __init__(self, workdir: Path, text: str, port: int) -> None:
        self.path = workdir / "haproxy.cfg"
        self.log = workdir / "haproxy.log"
        self.text, self.port = text, port
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> None:
        self.path.write_text(self.text)
        check = subprocess.run(
            [HAPROXY, "-c", "-f", str(self.path)], capture_output=True, text=True, check=False
        )
        if check.returncode != 0:
            raise RuntimeError(f"haproxy refuses {self.path}:\n{check.stdout}{check.stderr}")
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [HAPROXY, "-db", "-f", str(self.path)], stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"haproxy exited: {self.log.read_text(errors='replace')}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return
            if time.monotonic() > deadline:
                raise RuntimeError("haproxy did not listen in time")
            time.sleep(0.05)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            end_process(process, signal.SIGTERM, 10)
