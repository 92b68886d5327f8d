"""Child processes of the local deployment, the benches and the tests: a free loopback port
for one, and its end."""

from __future__ import annotations

import signal
import socket
import subprocess
from typing import Any


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
