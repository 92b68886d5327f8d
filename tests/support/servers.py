"""A real `python -m server` for a test: deploy/processes.py's ServerProcess (the one
harness of the tests, the benches and deploy/local.py) with the tests' settings, its log
under pytest's temporary folder."""

from __future__ import annotations

import tempfile
from pathlib import Path

from deploy.processes import ServerProcess as ServerProcess
from deploy.processes import free_port
from tests.support.corpus import REPO
from tests.support.timeouts import START_TIMEOUT

# Where the servers' logs go: set for the test session by conftest.py's
# `server_log_folder` (under pytest's own temporary directory); outside one, /tmp.
SERVER_LOGS: dict[str, Path] = {}

# What every server under test runs with, unless the test says otherwise.
TEST_ENV = {
    "PARLEY_LOG_FORMAT": "text",
    "PARLEY_STATIC_DIR": str(REPO / "server" / "static"),
    "PYTHONUNBUFFERED": "1",
    # Functional tests stream faster than real time on a shared machine: measured
    # admission control would refuse them. tests/server/test_overload.py turns it on.
    "PARLEY_ADMIT_MAX_QUEUE_WAIT_MS": "0",
}
# PARLEY_DRAIN_GRACE_S of the tests' deployments (deploy/local.py: 20 s, the time a
# balancer's health check takes to notice): no balancer watches a test's teardown, and each
# node's stop waits its grace out. Short, not 0, so the draining path still runs.
DRAIN_GRACE_S = 0.2


def start_server(
    env: dict[str, str] | None = None,
    *,
    wait: bool = True,
    port: int | None = None,
    cwd: Path = REPO,
    module: str = "server",
) -> ServerProcess:
    """`python -m <module>` with TEST_ENV and `env` on `port` (default: a free one); once
    ready unless `wait` is false."""
    port = port or free_port()
    log_file = tempfile.NamedTemporaryFile(  # noqa: SIM115 - only its name is kept
        prefix=f"parley-{port}-", suffix=".log", delete=False, dir=SERVER_LOGS.get("folder")
    )
    log_file.close()
    log = Path(log_file.name)
    server = ServerProcess(module, {**TEST_ENV, **(env or {})}, log, port=port, cwd=cwd)
    if wait:
        server.start(START_TIMEOUT)
    else:
        server.spawn()
    return server
