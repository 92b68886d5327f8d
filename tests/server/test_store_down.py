"""The meeting store unreachable as a stream starts, or as a transcript is read: a clean
refusal with its code (1013 `overloaded`, HTTP 503), counted, never an abnormal close."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.appserver import AppServer, serve_app
from tests.support.hardclient import STOP, error_of, exchange
from tests.support.redis_support import RedisServer


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path, persistent=False)
    server.start()
    yield server
    server.stop()


async def store_errors(server: AppServer) -> float:
    _, _, body = await server.request("GET", "/metrics")
    line = next(x for x in body.decode().splitlines() if x.startswith("parley_store_errors_total"))
    return float(line.split()[-1])


async def test_a_stream_that_starts_while_redis_is_down_gets_1013(redis: RedisServer) -> None:
    """The node knows the meeting (its source can be buffered) but cannot read its last
    `seq`: the stream gets an `error` `overloaded` and close 1013, the session is counted
    closed `store_failed`, and the transcript read answers 503, not 500."""
    async with serve_app(redis_url=redis.url) as server:
        url = f"{server.ws_url}/v1/meetings/down/stream"
        first = await exchange(url, [STOP])
        assert first.close_code == 1000, first.messages
        redis.kill()
        before = await store_errors(server)
        second = await exchange(url, [STOP])
        assert second.close_code == 1013, (second.close_code, second.messages)
        error = error_of(second)
        assert error is not None and error["code"] == "overloaded", second.messages
        assert "store" in error["message"]
        status, _, body = await server.request("GET", "/v1/meetings/down/transcript")
        assert status == 503, (status, body)
        assert await store_errors(server) >= before + 2
        _, _, metrics = await server.request("GET", "/metrics")
        assert b'reason="store_failed"' in metrics
        await asyncio.sleep(0)
