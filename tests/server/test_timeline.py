"""One meeting timeline on the real app and both stores (a fake recognizer: the test is
about order, not words): two sources whose audio overlaps in time and whose finals are
logged out of that order; the transcript in every format and a listener's replay come in
meeting time, `seq` stays gap-free in logged order, and a resumed source keeps its origin.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect

from server.uploads.routes import parse_started_at
from tests.support.appserver import AppServer, serve_app
from tests.support.corpus import clip
from tests.support.wsclient import ResumableStream, StreamResult, receive_all, stream_url

JFK = clip("en_jfk").pcm16()  # four phrases with pauses, 11 s
SHORT = clip("en_lj_LJ001-0002").pcm16()
SECOND = 32_000  # bytes of one second of 16 kHz pcm_s16le


@pytest.fixture(params=["memory", "redis"])
async def app(request: pytest.FixtureRequest, redis_prefix: str) -> AsyncIterator[AppServer]:
    settings: dict[str, Any] = {}
    if request.param == "redis":
        redis_url = request.getfixturevalue("redis_url")
        settings = {"redis_url": redis_url, "store_prefix": redis_prefix}
    async with serve_app(**settings) as server:
        yield server


def meeting_order(finals: list[dict[str, Any]]) -> list[int]:
    return [f["seq"] for f in sorted(finals, key=lambda f: (f["wall_time"]["start"], f["seq"]))]


async def test_transcript_and_replay_in_meeting_time(app: AppServer) -> None:
    meeting = f"timeline-{uuid.uuid4().hex[:8]}"
    live = StreamResult()
    async with connect(f"{app.ws_url}/v1/meetings/{meeting}/events", max_size=None) as listener:
        listening = asyncio.create_task(receive_all(listener, live))
        # ana starts first and speaks JFK's four phrases; her last phrase stays open ...
        ana = StreamResult()
        async with connect(stream_url(app.ws_url, meeting, participant="ana")) as ws:
            receiving = asyncio.create_task(receive_all(ws, ana))
            for offset in range(0, len(JFK), SECOND // 50):
                await ws.send(JFK[offset : offset + SECOND // 50])
            await ana.wait_for(lambda r: len(r.finals) >= 3)
            # ... while bo joins, drops once, resumes and finishes: his finals are logged
            # before ana's last one, though ana's last phrase started after his first.
            bo = ResumableStream(app.ws_url, meeting, SHORT + bytes(SECOND), "bo", speed=20.0)
            await bo.run(drop_at=[len(SHORT) // 2 // 2 * 2])
            await ws.send(orjson.dumps({"type": "stop"}).decode())
            await asyncio.wait_for(receiving, 30)
        await live.wait_for(lambda r: len(r.finals) == len(ana.finals) + len(bo.finals))
        listening.cancel()

    started = [c.messages[0] for c in bo.connections]
    assert len(started) == 2 and started[1]["resumed"]
    assert started[1]["origin"] == started[0]["origin"]  # a resumed source keeps its origin
    ana_origin = ana.messages[0]["origin"]
    assert ana_origin < started[0]["origin"]
    for finals, origin in ((ana.finals, ana_origin), (bo.finals, started[0]["origin"])):
        for f in finals:
            assert f["wall_time"]["start"] == pytest.approx(origin + f["start"], abs=0.0015)

    logged = ana.finals + bo.finals
    seqs = sorted(f["seq"] for f in logged)
    assert seqs == list(range(1, len(logged) + 1))  # gap-free in logged order
    assert [f["seq"] for f in live.finals] == seqs  # live events go out in seq order
    expected = meeting_order(logged)
    assert expected != seqs, "the test needs finals logged out of meeting order"

    status, _, body = await app.request("GET", f"/v1/meetings/{meeting}/transcript")
    assert status == 200
    transcript = orjson.loads(body)
    assert [f["seq"] for f in transcript["finals"]] == expected
    assert transcript["origin"] == ana_origin
    texts = {f["seq"]: f["text"] for f in logged}
    for fmt in ("txt", "srt", "vtt"):
        status, _, rendered = await app.request(
            "GET", f"/v1/meetings/{meeting}/transcript?format={fmt}"
        )
        assert status == 200
        lines = [line for line in rendered.decode().splitlines() if "n=" in line]
        assert len(lines) == len(expected), (fmt, lines)
        assert all(texts[seq] in line for seq, line in zip(expected, lines, strict=True)), lines

    replay = StreamResult()
    async with connect(f"{app.ws_url}/v1/meetings/{meeting}/events", max_size=None) as late:
        replaying = asyncio.create_task(receive_all(late, replay))
        await asyncio.wait_for(replay.wait_for(lambda r: len(r.finals) == len(logged)), 10)
        replaying.cancel()
    assert [f["seq"] for f in replay.finals] == expected


def test_started_at_takes_unix_seconds_or_rfc3339_with_an_offset() -> None:
    now = 1_764_637_800.0
    assert parse_started_at("1764637000.1234", now) == 1_764_637_000.123
    assert parse_started_at("2025-12-02T00:50:00Z", now) == 1_764_636_600.0
    assert parse_started_at("2025-12-02T01:50:00+01:00", now) == 1_764_636_600.0
    for bad in ("2025-12-02T00:50:00", "yesterday", "nan", "inf", "1764637000123", "12", ""):
        assert parse_started_at(bad, now) is None, bad  # no offset, not a time, ms, < 2000
