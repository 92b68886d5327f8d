"""The load generator against the real Parley app (VAD, segmenter, sessions, scheduler) with
the engine faked: fast, so the protocol interplay is checked on every run."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from loadgen.client import StreamOptions
from loadgen.report import Limits
from loadgen.run import LoadSettings, run_load
from tests.support.appserver import serve_app
from tests.support.corpus import clip
from tests.support.loadgen_checks import parse_srt, run_module
from tests.support.timeouts import S

TIMEOUT = 120 * S


@pytest.fixture(scope="module")
async def fake_engine_server() -> AsyncIterator[str]:
    """The real app under uvicorn on a free loopback port, FakeRecognizer as its engine."""
    async with serve_app(max_sessions=64) as server:
        yield server.ws_url


async def test_rooms_against_the_real_app_lose_nothing(fake_engine_server: str) -> None:
    """Two rooms of two participants at 6x: every clip gets a final, none twice, all clean."""
    settings = LoadSettings(
        server=fake_engine_server,
        rooms=2,
        participants_per_room=2,
        duration_s=30.0,
        ramp_s=0.5,
        progress=False,
        stream=StreamOptions(speed=6.0, drain_timeout=30.0),
    )
    # The server shares this process (and its GIL): judge the client's lag leniently.
    report = await run_load(settings, Limits(slo_p95=5.0, max_client_lag=1.0))
    totals = report["totals"]
    assert report["errors"] == {} and totals["sessions_clean"] == 4, report["errors"]
    assert (totals["lost"], totals["duplicates"], totals["spurious"]) == (0, 0, 0)
    assert totals["finals"] >= totals["utterances"] >= 4
    assert totals["beyond_audio"] == 0 and totals["malformed"] == 0
    assert report["latency"]["server"]["total"]["count"] == totals["finals"]
    assert report["latency"]["final"]["p50"] < 5.0  # a fake engine: only the loop adds delay
    assert report["verdict"]["passed"], report["verdict"]


async def test_replay_transcript_matches_the_servers(
    fake_engine_server: str, tmp_path: Path
) -> None:
    """A replayed clip's SRT is byte for byte the server's GET .../transcript?format=srt."""
    srt = tmp_path / "jfk.srt"
    code, _, err = await run_module(
        "loadgen.replay",
        str(clip("en_jfk").path),
        "--speed",
        "max",
        "--meeting",
        "replay-jfk",
        "--server",
        fake_engine_server,
        "--out",
        str(srt),
        timeout=TIMEOUT,
    )
    assert code == 0, err
    assert len(parse_srt(srt.read_text())) >= 2
    http = fake_engine_server.replace("ws://", "http://")
    served = await asyncio.to_thread(
        lambda: urllib.request.urlopen(
            f"{http}/v1/meetings/replay-jfk/transcript?format=srt", timeout=30
        ).read()
    )
    assert served.decode() == srt.read_text()
    json_out = tmp_path / "jfk.json"
    code, _, err = await run_module(
        "loadgen.replay",
        str(clip("en_jfk").path),
        "--speed",
        "max",
        "--meeting",
        "replay-jfk2",
        "--server",
        fake_engine_server,
        "--out",
        str(json_out),
        timeout=TIMEOUT,
    )
    assert code == 0, err
    assert orjson.loads(json_out.read_bytes())["meeting_id"] == "replay-jfk2"
