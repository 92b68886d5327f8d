"""The load generator and replay, end to end against the protocol v1 stub (fast, no model)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest

from loadgen.__main__ import build_parser
from loadgen.client import StreamOptions
from loadgen.html_report import cdf_points, nice_ticks, render_html
from loadgen.replay import default_participants, format_for, transcript
from loadgen.report import Limits
from loadgen.run import LoadSettings, SearchSettings, find_max_rooms, prepare_corpus, run_load
from tests.support.corpus import clip
from tests.support.loadgen_checks import assert_summary_matches, parse_srt, run_module, to_flac
from tests.support.timeouts import S
from tests.support.v1_stub import StubBehaviour, stub_server
from wire.messages import TranscriptFinal
from wire.transcript import TranscriptFormat

TIMEOUT = 60 * S


def settings(url: str, **changes: Any) -> LoadSettings:
    base = LoadSettings(
        server=url,
        rooms=2,
        participants_per_room=2,
        duration_s=30.0,
        ramp_s=0.0,
        progress=False,
        stream=StreamOptions(speed=None, drain_timeout=10.0),
    )
    return replace(base, **changes)


def room_index(meeting: str) -> int:
    match = re.search(r"-r(\d+)$", meeting)
    assert match, meeting
    return int(match[1])


async def test_run_load_accounts_every_utterance() -> None:
    """Against a server that finalises every clip, nothing is lost, duplicated or spurious."""
    async with stub_server() as stub:
        report = await run_load(settings(stub.url), Limits(slo_p95=5.0))
    totals = report["totals"]
    assert totals["sources"] == 4 and totals["sessions_clean"] == 4
    assert totals["utterances"] >= 4 and totals["finals"] == totals["utterances"]
    assert all(r["utterances"] >= 2 for r in report["rooms"])
    assert (totals["lost"], totals["duplicates"], totals["spurious"]) == (0, 0, 0)
    assert report["errors"] == {} and report["verdict"]["passed"], report["verdict"]
    assert report["latency"]["final"]["count"] == totals["finals"]
    assert report["latency"]["first_partial"]["count"] > 0
    assert totals["audio_seconds_sent"] == sum(r["audio_seconds"] * 2 for r in report["rooms"])
    assert all(r["wer"] == 1.0 for r in report["rooms"])  # the stub says "stub words"
    page = render_html(report)
    assert page.count("<svg") == 3 and "<script" not in page


async def test_duplicates_and_refusals_are_reported() -> None:
    """Room 0 gets every final twice, room 1 is refused with 503: both show in the report."""
    behaviours = {0: StubBehaviour(duplicate_finals=True), 1: StubBehaviour(http_status=503)}
    async with stub_server(lambda m: behaviours[room_index(m)]) as stub:
        report = await run_load(settings(stub.url), Limits())
    room0, room1 = report["rooms"]
    assert room0["duplicates"] == room0["finals"] > 0 and room0["lost"] == 0
    assert room1["errors"] == {"http_503": 2} and room1["lost"] == room1["utterances"]
    assert report["errors"] == {"http_503": 2}
    assert not report["verdict"]["passed"]


async def test_run_deadline_ends_a_stuck_run() -> None:
    """Sockets still open at the run's deadline are cut and reported as run_deadline."""
    async with stub_server(lambda m: StubBehaviour(no_session_ended=True)) as stub:
        report = await run_load(settings(stub.url, deadline_s=0.5), Limits())
    assert report["errors"] == {"run_deadline": 4}
    assert report["totals"]["sessions_clean"] == 0


async def test_find_max_rooms_converges_on_capacity() -> None:
    """A server that refuses room index 3 and up sustains 3 rooms: 1, 2, 4 (fail), 3."""
    behaviour_for = lambda m: StubBehaviour(http_status=503 if room_index(m) >= 3 else None)  # noqa: E731
    async with stub_server(behaviour_for) as stub:
        summary, best = await find_max_rooms(
            settings(stub.url, participants_per_room=1, duration_s=3.0),
            Limits(slo_p95=5.0),
            SearchSettings(start=1, max_rooms=16, budget_s=TIMEOUT),
        )
    assert summary["max_rooms"] == 3
    assert [(s["rooms"], s["passed"]) for s in summary["steps"]] == [
        (1, True),
        (2, True),
        (4, False),
        (3, True),
    ]
    assert best is not None and best["totals"]["rooms"] == 3


async def test_loadgen_cli_prints_what_it_writes(tmp_path: Path) -> None:
    """`python -m loadgen` exits 0, and its printed figures are the JSON report's."""
    async with stub_server() as stub:
        code, out, err = await run_module(
            "loadgen",
            "--rooms",
            "2",
            "--duration",
            "5",
            "--speed",
            "max",
            "--ramp",
            "0",
            "--server",
            stub.url,
            "--report-dir",
            str(tmp_path),
            "--no-progress",
            timeout=TIMEOUT,
        )
    assert code == 0, err
    report = orjson.loads((tmp_path / "report.json").read_bytes())
    assert_summary_matches(out, report)
    assert (tmp_path / "report.html").read_text().count("<svg") == 3


async def test_replay_two_tracks_writes_srt(tmp_path: Path) -> None:
    """Two files (FLAC and WAV) replay as one meeting; the SRT has one cue per final."""
    wav = clip("en_ls_1089-134686-0001").path
    flac = to_flac(clip("en_jfk").path, tmp_path / "other.flac")
    srt = tmp_path / "meeting.srt"
    async with stub_server() as stub:
        code, out, err = await run_module(
            "loadgen.replay",
            str(flac),
            str(wav),
            "--participant",
            "alice",
            "--participant",
            "bob",
            "--speed",
            "max",
            "--server",
            stub.url,
            "--out",
            str(srt),
            "--meeting",
            "replay-test",
            timeout=TIMEOUT,
        )
    assert code == 0, err
    cues = parse_srt(srt.read_text())
    assert {text.split(":")[0] for _, _, text in cues} == {"alice", "bob"}
    assert len(cues) == sum(1 for line in out.splitlines() if line.startswith("["))
    assert "meeting replay-test:" in err


async def test_replay_rejects_mismatched_participants(tmp_path: Path) -> None:
    """Two files with one --participant is a usage error (exit 2), before any connection."""
    wav = str(clip("en_jfk").path)
    code, _, err = await run_module(
        "loadgen.replay",
        wav,
        wav,
        "--participant",
        "solo",
        "--server",
        "ws://127.0.0.1:9",
        timeout=TIMEOUT,
    )
    assert code == 2 and "2 files need 2 --participant names" in err


def test_nice_ticks() -> None:
    """Ticks are round numbers covering the range."""
    assert nice_ticks(0.0, 1.13) == [0.0, 0.25, 0.5, 0.75, 1.0, 1.25]
    assert nice_ticks(0.0, 10.0) == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert nice_ticks(3.0, 3.0) == [3.0]


def test_cdf_points_are_steps() -> None:
    """The empirical CDF rises by 1/n at each value, as a step."""
    assert cdf_points([2.0, 1.0]) == [(1.0, 0.0), (1.0, 0.5), (2.0, 0.5), (2.0, 1.0)]
    assert len(cdf_points([float(i) for i in range(1000)], limit=100)) == 100


def test_replay_transcript_orders_by_audio_time() -> None:
    """Finals render in start order, whatever their seq, through the server's renderer."""
    finals: list[TranscriptFinal] = [
        {
            "type": "transcript.final",
            "utterance_id": "b1",
            "seq": 1,
            "participant": "bob",
            "text": "second",
            "start": 2.0,
            "end": 3.0,
            "language": "en",
        },
        {
            "type": "transcript.final",
            "utterance_id": "a1",
            "seq": 2,
            "participant": "alice",
            "text": "first",
            "start": 0.5,
            "end": 1.25,
            "language": "en",
        },
    ]
    assert transcript("m", finals, TranscriptFormat.SRT) == (
        "1\n00:00:00,500 --> 00:00:01,250\nalice: first\n\n"
        "2\n00:00:02,000 --> 00:00:03,000\nbob: second\n"
    )
    assert [c[2] for c in parse_srt(transcript("m", finals, TranscriptFormat.SRT))] == [
        "alice: first",
        "bob: second",
    ]


def test_replay_names_and_formats() -> None:
    """Participant names come from file stems in the id alphabet; --out's suffix picks a format."""
    assert default_participants([Path("a/one.wav")]) == ["speaker"]
    assert default_participants([Path("Bob Smith.mp3"), Path("x/Bob Smith.wav")]) == [
        "Bob_Smith",
        "Bob_Smith-2",
    ]
    assert format_for(Path("t.VTT"), None) is TranscriptFormat.VTT
    assert format_for(Path("t.out"), None) is TranscriptFormat.TXT
    assert format_for(None, "json") is TranscriptFormat.JSON


def test_language_options_pick_the_clips() -> None:
    """--language takes a code or auto; with auto, --corpus-language picks (and scores) clips."""
    args = build_parser().parse_args(["--language", "auto", "--corpus-language", "es"])
    assert (args.language, args.corpus_language) == ("auto", "es")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--language", "Spanish"])
    auto = LoadSettings(stream=StreamOptions(language="auto"), progress=False)
    assert auto.clip_language == "en"
    assert LoadSettings(stream=StreamOptions(language="de")).clip_language == "de"
    spanish = replace(auto, corpus_language="es")
    assert spanish.clip_language == "es"
    assert {c.language for c in prepare_corpus(spanish).clips} == {"es"}
