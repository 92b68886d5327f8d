"""The load generator and replay against a real Parley server with the real model."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import orjson
import pytest

from loadgen.wer import error_rate
from tests.support.corpus import clip
from tests.support.loadgen_checks import assert_summary_matches, parse_srt, run_module
from tests.support.servers import ServerProcess
from tests.support.timeouts import S

pytestmark = pytest.mark.slow

RUN_TIMEOUT = 300 * S


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        body: bytes = response.read()
        return body


async def test_loadgen_three_rooms_accounts_for_every_utterance(
    parley_server: ServerProcess, tmp_path: Path
) -> None:
    """Three real-time rooms for ~20 s: no utterance lost, plausible figures, JSON == printed."""
    code, out, err = await run_module(
        "loadgen",
        "--rooms",
        "3",
        "--duration",
        "20",
        "--ramp",
        "2",
        "--server",
        parley_server.ws_url,
        "--report-dir",
        str(tmp_path),
        "--no-progress",
        timeout=RUN_TIMEOUT,
    )
    report = orjson.loads((tmp_path / "report.json").read_bytes())
    assert code == 0, f"{out}\n{err}\n{report['verdict']}"
    totals = report["totals"]
    assert totals["sources"] == 3 and totals["sessions_clean"] == 3 and report["errors"] == {}
    assert totals["utterances"] >= 3
    assert (totals["lost"], totals["duplicates"], totals["spurious"]) == (0, 0, 0)
    assert totals["finals"] >= totals["utterances"]
    rooms = report["rooms"]
    assert totals["audio_seconds_sent"] == pytest.approx(sum(r["audio_seconds"] for r in rooms))
    assert all(15 <= room["audio_seconds"] <= 20 + 2 for room in rooms)  # clips fill ~20 s
    final, partial = report["latency"]["final"], report["latency"]["partial"]
    assert final["count"] == totals["finals"] and 0 < final["p50"] <= final["p95"] < 10
    assert partial["count"] > 0 and 0 <= partial["p50"] < 10
    assert report["wer"]["overall"] <= 0.3
    assert all(room["final_latency"]["count"] >= 1 for room in rooms)
    assert not report["client"]["fell_behind"]
    assert report["latency"]["server"]["total"]["count"] == totals["finals"]  # `timing` sent
    assert_summary_matches(out, report)
    assert (tmp_path / "report.html").read_text().count("<svg") == 3


async def test_replay_at_max_speed_gives_accurate_srt(
    parley_server: ServerProcess, tmp_path: Path
) -> None:
    """A corpus clip at --speed max: WER ≤ 0.15, a valid SRT, the same as the server's."""
    source = clip("en_ls_2412-153948-0000")
    srt = tmp_path / "clip.srt"
    meeting = "e2e-replay-srt"
    code, out, err = await run_module(
        "loadgen.replay",
        str(source.path),
        "--speed",
        "max",
        "--server",
        parley_server.ws_url,
        "--meeting",
        meeting,
        "--out",
        str(srt),
        timeout=RUN_TIMEOUT,
    )
    assert code == 0, f"{out}\n{err}"
    text = srt.read_text(encoding="utf-8")
    cues = parse_srt(text)
    assert cues and all(cue_text.startswith("speaker: ") for _, _, cue_text in cues)
    hypothesis = " ".join(cue_text.removeprefix("speaker: ") for _, _, cue_text in cues)
    assert error_rate(source.reference, hypothesis) <= 0.15, hypothesis
    assert cues[-1][1] <= source.duration + 0.5
    server_srt = await asyncio.to_thread(
        fetch, f"{parley_server.http_url}/v1/meetings/{meeting}/transcript?format=srt"
    )
    assert server_srt.decode() == text
