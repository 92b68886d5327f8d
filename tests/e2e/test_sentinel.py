"""Redis failover under a live meeting: a real `python -m server` on a Sentinel-managed
store (`redis+sentinel://`, a primary, a replica and three sentinels of the test's own),
the primary SIGKILLed mid-stream, the replica promoted. The stream goes on, and the
transcript read after the failover holds every final the client received, once each, in
order, gap-free."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from deploy.sentinel import Sentineled
from loadgen.wer import error_rate
from tests.support.corpus import clip
from tests.support.servers import ServerProcess, start_server
from tests.support.wsclient import stream_pcm

pytestmark = pytest.mark.slow

LONG = "en_ls_1221-135766-0001"  # 16.7 s, several utterances
JFK = "en_jfk"


@pytest.fixture
def sentineled(tmp_path: Path) -> Iterator[Sentineled]:
    group = Sentineled(tmp_path)
    try:
        group.start()
        yield group
    finally:
        group.stop()


def _logged(server: ServerProcess, meeting: str) -> list[dict[str, object]]:
    status, body = server.get(f"/v1/meetings/{meeting}/transcript")
    assert status == 200, body
    finals: list[dict[str, object]] = orjson.loads(body)["finals"]
    return finals


async def _until_ready(server: ServerProcess, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        status, body = await asyncio.to_thread(server.get, "/readyz")
        if status == 200:
            return
        assert time.monotonic() < deadline, body
        await asyncio.sleep(0.2)


async def test_primary_killed_mid_meeting_loses_no_final(sentineled: Sentineled) -> None:
    server = await asyncio.to_thread(start_server, {"PARLEY_REDIS_URL": sentineled.url})
    try:
        speech = clip(LONG)
        stream = asyncio.create_task(
            stream_pcm(server.ws_url, "failover", speech.pcm16() * 2, speed=1.5)
        )
        # the primary dies once the meeting has a final in Redis, mid-stream
        deadline = time.monotonic() + 120
        while not stream.done() and not await asyncio.to_thread(_has_final, server, "failover"):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        assert not stream.done(), "the stream ended before the primary was killed"
        old = sentineled.kill_primary()
        new = await asyncio.to_thread(sentineled.wait_promoted, old)
        assert new != old
        result = await stream
        assert result.messages[-1]["type"] == "session.ended", result.messages[-3:]
        await _until_ready(server)  # buffered writes replayed on the new primary

        received = [f["utterance_id"] for f in result.finals]
        logged = _logged(server, "failover")
        assert [f["utterance_id"] for f in logged] == received  # none lost, none extra
        assert [f["seq"] for f in logged] == list(range(1, len(logged) + 1))
        assert len(received) >= 4, result.finals  # two passes of several utterances
        assert error_rate(speech.reference + " " + speech.reference, result.text) <= 0.2

        # a meeting opened after the failover lives on the new primary
        after = await stream_pcm(server.ws_url, "after", clip(JFK).pcm16(), speed=3.0)
        assert after.finals
        assert [f["utterance_id"] for f in _logged(server, "after")] == [
            f["utterance_id"] for f in after.finals
        ]
    finally:
        server.stop()


def _has_final(server: ServerProcess, meeting: str) -> bool:
    """Whether the meeting's log holds a final yet (404 before the meeting exists)."""
    status, body = server.get(f"/v1/meetings/{meeting}/transcript")
    return status == 200 and bool(orjson.loads(body)["finals"])
