"""Protected mode seen from another host: `python -m server --host 0.0.0.0` (the
Procfile's line, real model) in one network namespace, a client in a second one across a
veth pair. One server start per access mode, every route tried from the remote host by
tests/support/route_probe.py (run there with `ip netns exec`: a namespace belongs to a process)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from deploy.processes import end_process
from tests.support.corpus import REPO
from tests.support.netns import Hosts, two_hosts
from tests.support.route_probe import (
    MEETING_ROUTES,
    OPEN_ROUTES,
    READY_TIMEOUT_S,
    Answer,
    mismatches,
    refused_everywhere,
    served_everywhere,
)

pytestmark = pytest.mark.slow

PORT = 8000  # the namespace is new: nothing else listens there
KEY = "netns-test-key-0123456789abcdef"
PROBE_TIMEOUT_S = READY_TIMEOUT_S + 120.0


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    with two_hosts("pz") as made:
        yield made


class Server:
    """`python -m server --host 0.0.0.0` inside the server's namespace."""

    def __init__(self, hosts: Hosts, log: Path, env: dict[str, str]) -> None:
        self.hosts = hosts
        self.log_path = log
        no_bwrap = log.parent / "bin"  # a PATH without bubblewrap: the sandbox is missing
        no_bwrap.mkdir(exist_ok=True)
        full_env = {
            **os.environ,
            "PATH": str(no_bwrap),
            "PARLEY_LOG_FORMAT": "text",
            "PARLEY_STATIC_DIR": str(REPO / "server" / "static"),
            "PARLEY_MODEL_PROCESSES": "off",  # one model load, in the server's process
            "PARLEY_DIARIZATION": "false",
            "PARLEY_ADMIT_MAX_QUEUE_WAIT_MS": "0",
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        command = [sys.executable, "-m", "server", "--host", "0.0.0.0", "--port", str(PORT)]
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                hosts.inside(hosts.server_ns) + command,
                cwd=REPO,
                env=full_env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def probe(self, namespace: str, host: str, *args: str) -> dict[str, Any]:
        """Run tests/support/route_probe.py in `namespace` against this server (it waits for
        /readyz first); what it printed. Fails at once if the server exits."""
        command = [
            sys.executable,
            "-m",
            "tests.support.route_probe",
            f"http://{host}:{PORT}",
            *args,
        ]
        probe = subprocess.Popen(
            self.hosts.inside(namespace) + command,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + PROBE_TIMEOUT_S
        while True:
            try:
                out, err = probe.communicate(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    probe.kill()
                    probe.communicate()
                    raise RuntimeError(f"server exited or probe hung:\n{self.log()}") from None
        assert probe.returncode == 0, (err.decode(), self.log())
        result: dict[str, Any] = orjson.loads(out)
        return result

    def remote_answers(self, *headers: str) -> dict[str, Answer]:
        args = [arg for header in headers for arg in ("--header", header)]
        found = self.probe(self.hosts.client_ns, self.hosts.server_ip, *args)
        return {route: Answer(**answer) for route, answer in found["answers"].items()}

    def stop(self) -> None:
        end_process(self.process, timeout=30)


@pytest.fixture
def serve(hosts: Hosts, tmp_path: Path) -> Iterator[Any]:
    servers: list[Server] = []

    def start(**env: str) -> Server:
        server = Server(hosts, tmp_path / "server.log", env)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def test_protected_mode_refuses_the_remote_host_and_serves_loopback(serve: Any) -> None:
    """No key (the Procfile as it is): from the other host every meeting route is refused
    (403 / 4403, protected_mode), with or without a spoofed `X-Forwarded-For: 127.0.0.1`
    (that host is no trusted proxy), while /healthz, /readyz and /metrics answer it; the
    start line and /readyz say `protected`; inside the server's host, a loopback client
    is served on every route and streams JFK through the real model."""
    server = serve()
    for spoof in ((), ("X-Forwarded-For: 127.0.0.1",)):
        answers = server.remote_answers(*spoof)
        assert not mismatches(answers, refused_everywhere()), (spoof, answers)
        assert all(answers[route].status == 200 for route in OPEN_ROUTES), answers
    local = server.probe(server.hosts.server_ns, "127.0.0.1")
    assert local["readyz"]["access"] == "protected"
    answers = {route: Answer(**answer) for route, answer in local["answers"].items()}
    assert not mismatches(answers, served_everywhere())  # the loopback upload, unsandboxed
    jfk = server.probe(server.hosts.server_ns, "127.0.0.1", "--stream-jfk")["jfk"]
    assert jfk["close"] == 1000 and "fellow americans" in jfk["text"].lower(), jfk
    assert "access: protected" in server.log() and "PARLEY_PROTECTED_MODE=off" in server.log()


def test_a_trusted_proxy_cannot_make_its_client_loopback(serve: Any, hosts: Hosts) -> None:
    """A peer inside PARLEY_TRUSTED_PROXIES (the other host, trusted as a proxy) that
    claims `X-Forwarded-For: 127.0.0.1` is refused on every meeting route (403 / 4403
    protected_mode): a forwarded address is never loopback. /healthz, /readyz and
    /metrics still answer it."""
    server = serve(PARLEY_TRUSTED_PROXIES=hosts.client_ip)
    answers = server.remote_answers("X-Forwarded-For: 127.0.0.1")
    assert not mismatches(answers, refused_everywhere()), answers
    assert all(answers[route].status == 200 for route in OPEN_ROUTES), answers


def test_a_key_serves_the_remote_host(serve: Any) -> None:
    """With API keys, the remote host's requests with a key are served on every meeting
    route (its upload too: PARLEY_UPLOAD_SANDBOX=off decodes unconfined on purpose)."""
    server = serve(PARLEY_API_KEYS=f"acme:{KEY}", PARLEY_UPLOAD_SANDBOX="off")
    answers = server.remote_answers(f"Authorization: Bearer {KEY}")
    assert not mismatches(answers, served_everywhere()), answers
    assert "access: keys" in server.log()


def test_protected_mode_off_serves_the_remote_host_but_not_unsandboxed_uploads(
    serve: Any,
) -> None:
    """PARLEY_PROTECTED_MODE=off serves the remote host anonymously, on every meeting
    route but the upload: with the sandbox missing (no bubblewrap on the server's PATH)
    it is refused 503 sandbox_unavailable, so its job does not exist (404)."""
    server = serve(PARLEY_PROTECTED_MODE="off")
    answers = server.remote_answers()
    assert set(answers) == {*MEETING_ROUTES, *OPEN_ROUTES}
    not_found = {"status": 404, "code": "not_found"}
    expected = served_everywhere(
        upload={"status": 503, "code": "sandbox_unavailable"}, job=not_found, delete_job=not_found
    )
    assert not mismatches(answers, expected), answers
    assert "access: anonymous" in server.log()
