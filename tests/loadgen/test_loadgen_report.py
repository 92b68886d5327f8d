"""Report math: known events in, known figures out (no sockets)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from loadgen.client import FinalEvent, PartialEvent, SourceLog, Track
from loadgen.corpus import RoomPlan, Utterance
from loadgen.report import (
    ClientHealth,
    Limits,
    RoomRun,
    build_report,
    latency_trend,
    overlaps,
    render_summary,
    source_figures,
    summarize,
)
from wire.messages import TranscriptFinal, TranscriptPartial


def final(uid: str, start: float, end: float, text: str, seq: int) -> TranscriptFinal:
    return {
        "type": "transcript.final",
        "utterance_id": uid,
        "seq": seq,
        "participant": "p0",
        "text": text,
        "start": start,
        "end": end,
        "language": "en",
    }


def timed(message: TranscriptFinal, queue: float, inference: float) -> TranscriptFinal:
    message["timing"] = {"queue": queue, "inference": inference, "total": queue + inference}
    return message


def partial(uid: str, start: float, end: float) -> TranscriptPartial:
    return {
        "type": "transcript.partial",
        "utterance_id": uid,
        "participant": "p0",
        "text": "...",
        "start": start,
        "end": end,
    }


def plan(meeting: str, utterances: list[Utterance], participants: tuple[str, ...]) -> RoomPlan:
    track = Track((np.zeros(8 * 16_000, dtype=np.int16),))
    return RoomPlan(meeting, participants, {p: track for p in participants}, tuple(utterances))


REFS = [
    Utterance("p0", "c1", 1.0, 3.0, "Hello, world."),
    Utterance("p0", "c2", 5.0, 6.0, "GOOD MORNING"),
    Utterance("p0", "c3", 6.5, 6.9, "see you"),
]


def busy_log() -> SourceLog:
    """Finals for c1 and c2 (c2 twice), a spurious one, c3 lost; three partials."""
    log = SourceLog("room-a", "p0")
    log.finals += [
        FinalEvent(timed(final("u1", 0.9, 3.0, "hello world", 1), 0.1, 0.3), 10.0, 0.8),
        FinalEvent(timed(final("u2", 5.0, 6.0, "good morning", 2), 0.2, 0.5), 12.0, 1.2),
        FinalEvent(final("u2", 5.0, 6.0, "good morning", 2), 12.5, 1.7),  # duplicate
        FinalEvent(final("u3", 7.0, 7.5, "yes", 3), 13.0, 0.4),  # spurious
    ]
    log.partials += [
        PartialEvent(partial("u1", 0.9, 1.5), 8.0, 0.3, 0.5),
        PartialEvent(partial("u1", 0.9, 2.5), 9.0, 0.35, 1.5),
        PartialEvent(partial("u2", 5.0, 5.5), 11.0, 0.25, 0.4),
    ]
    return log


def test_summarize_known_percentiles() -> None:
    """Linear-interpolated percentiles of 1..5 and of three values; empty gives None."""
    figures = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert figures["count"] == 5 and figures["mean"] == 3.0
    assert figures["p50"] == 3.0 and figures["p90"] == pytest.approx(4.6)
    assert figures["p95"] == pytest.approx(4.8) and figures["p99"] == pytest.approx(4.96)
    assert summarize([0.4, 0.8, 1.2])["p95"] == pytest.approx(1.16)
    empty = summarize([])
    assert empty["count"] == 0 and empty["p95"] is None and empty["mean"] is None


def test_overlaps_excludes_touching_spans() -> None:
    """Spans sharing time overlap; spans that only touch do not."""
    assert overlaps(0, 2, 1, 3) and overlaps(1, 3, 0, 2) and overlaps(0, 10, 4, 5)
    assert not overlaps(0, 1, 1, 2) and not overlaps(2, 3, 0, 1)


def test_latency_trend() -> None:
    """Median of the last third minus median of the first; None below twelve points."""
    latencies = [1, 1, 1, 1, 2, 2, 2, 2, 3, 5, 5, 5]
    points = [(float(t), float(lat)) for t, lat in enumerate(latencies)]
    assert latency_trend(points) == 4.0
    assert latency_trend(points[:11]) is None


def test_source_figures_account_lost_spurious_duplicates_and_wer() -> None:
    """One lost, one spurious, one duplicate; WER counts the lost words and the extra "yes"."""
    figures = source_figures(busy_log(), REFS, "en")
    assert [u.clip_id for u in figures.lost] == ["c3"]
    assert figures.spurious == 1 and figures.duplicates == 1
    assert len(figures.unique_finals) == 3
    # hello world good morning see you  vs  hello world good morning yes: 1 sub + 1 del
    assert (figures.wer.substitutions, figures.wer.deletions, figures.wer.insertions) == (1, 1, 0)
    assert figures.wer.reference_length == 6
    assert figures.final_points == [(10.0, 0.8), (12.0, 1.2), (13.0, 0.4)]
    assert sorted(figures.first_partials) == [0.4, 0.5]
    assert figures.beyond_audio == 0


def clean_log(meeting: str, participant: str, text: str) -> SourceLog:
    log = SourceLog(meeting, participant)
    message = final("v1", 1.0, 2.0, text, 1)
    message["participant"] = participant
    log.finals.append(FinalEvent(message, 20.0, 0.6))
    log.ended = {
        "type": "session.ended",
        "reason": "stop",
        "audio_seconds": 8.0,
        "utterances": 1,
        "finals": 1,
        "finals_lost": 0,
    }
    log.close_code = 1000
    return log


def two_rooms() -> list[RoomRun]:
    busy = busy_log()
    busy.ended = {
        "type": "session.ended",
        "reason": "stop",
        "audio_seconds": 8.0,
        "utterances": 3,
        "finals": 3,
        "finals_lost": 0,
    }
    busy.close_code = 1000
    refs_b = [
        Utterance("p0", "c4", 1.0, 2.0, "one two"),
        Utterance("p1", "c5", 3.0, 4.0, "three four"),
    ]
    failed = SourceLog("room-b", "p1")
    failed.fail("1013", "at capacity")
    return [
        RoomRun(plan("room-a", REFS, ("p0",)), (busy,)),
        RoomRun(
            plan("room-b", refs_b, ("p0", "p1")), (clean_log("room-b", "p0", "one two"), failed)
        ),
    ]


def report_for(limits: Limits, loop_lags: list[float] | None = None) -> dict[str, Any]:
    health = ClientHealth(loop_lags or [0.001] * 10, cpu_seconds=5.0, wall_seconds=20.0)
    return build_report({"speed": 1.0, "participants_per_room": 1}, two_rooms(), health, limits)


def test_build_report_totals_rooms_and_errors() -> None:
    """Totals, per-room rows, WER sums and errors by close code come out as computed by hand."""
    report = report_for(Limits())
    totals = report["totals"]
    assert totals["rooms"] == 2 and totals["sources"] == 3
    assert totals["utterances"] == 5 and totals["finals"] == 4
    assert (totals["lost"], totals["duplicates"], totals["spurious"]) == (2, 1, 1)
    assert totals["sessions_clean"] == 2
    assert report["errors"] == {"1013": 1}
    # finals' latencies 0.8, 1.2, 0.4 (room a) and 0.6 (room b): duplicates excluded
    final_latency = report["latency"]["final"]
    assert final_latency["count"] == 4 and final_latency["p50"] == pytest.approx(0.7)
    assert report["latency"]["partial"]["count"] == 3
    assert report["latency"]["first_partial"]["p50"] == pytest.approx(0.45)
    # room a: 2 errors / 6 words; room b: p0 exact, p1 two deletions: 2 / 4
    room_a, room_b = report["rooms"]
    assert room_a["wer"] == pytest.approx(2 / 6) and room_b["wer"] == pytest.approx(2 / 4)
    assert report["wer"]["overall"] == pytest.approx(4 / 10)
    assert room_b["errors"] == {"1013": 1} and room_b["lost"] == 1
    assert room_a["lost_utterances"] == [
        {"participant": "p0", "clip": "c3", "start": 6.5, "end": 6.9}
    ]
    assert report["client"]["cpu_percent"] == 25.0 and not report["client"]["fell_behind"]
    assert report["series"]["final"][0] == [10.0, 0.8, 0.0]
    server = report["latency"]["server"]
    assert server["total"]["count"] == 2 and server["total"]["p50"] == pytest.approx(0.55)
    assert server["queue"]["max"] == 0.2 and server["inference"]["min"] == 0.3


def test_verdict_names_every_reason() -> None:
    """Over the SLO, lost utterances, errors and a lagging client each fail the run."""
    report = report_for(Limits(slo_p95=1.0), loop_lags=[0.2] * 10)
    verdict = report["verdict"]
    assert not verdict["passed"]
    reasons = " | ".join(verdict["reasons"])
    assert "P95 1.140 s > SLO 1 s" in reasons
    assert "2 of 5 utterances lost" in reasons
    assert "1013: 1" in reasons
    assert "client fell behind" in reasons
    assert report_for(Limits(slo_p95=2.0))["verdict"]["reasons"] == [
        "2 of 5 utterances lost",
        "errors: 1013: 1",
    ]


def test_summary_prints_the_report_figures() -> None:
    """The printed table carries the JSON's figures, rounded to milliseconds."""
    report = report_for(Limits(slo_p95=1.0))
    text = render_summary(report)
    row = re.search(r"^final\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", text, re.M)
    assert row is not None
    latency = report["latency"]["final"]
    assert int(row[1]) == latency["count"]
    assert [float(v) for v in row.groups()[1:]] == [
        round(latency[k], 3) for k in ("p50", "p90", "p95", "p99")
    ]
    assert "lost 2" in text and "duplicates 1" in text and "WER 0.400" in text
    assert "SLO final P95 ≤ 1 s: FAIL" in text
