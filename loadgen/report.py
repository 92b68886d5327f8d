"""Turn what the sources observed into figures: latency percentiles, WER, lost and duplicate
finals, errors, client health, and an SLO verdict. Pure functions, no I/O.

Definitions (the report's `definitions` field repeats them):
- final / partial latency: receive time - time the audio at the message's `end` was sent;
- first partial: receive time of an utterance's first partial - time the audio at its
  `start` was sent;
- lost: a reference utterance (one clip) with no final of its participant overlapping
  its audio span; spurious: a final overlapping no reference utterance;
- duplicate: another copy of a final whose `utterance_id` was already received;
- WER: per participant, its references joined in order against its finals ordered by
  `start` (first copy of each), summed over the room (or the run) before dividing;
- partial cadence: a room's partials per 2 s of its reference speech (the clips' spans).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from loadgen.client import FinalEvent, SourceLog
from loadgen.corpus import RoomPlan, Utterance
from loadgen.wer import ErrorCounts, error_counts
from wire.codes import DEFAULT_SAMPLE_RATE
from wire.messages import Timing

PERCENTILES = (50, 90, 95, 99)
REPORT_VERSION = 1

DEFINITIONS = {
    "final_latency": "receive time - time the audio at the final's `end` was sent (s)",
    "partial_latency": "receive time - time the audio at the partial's `end` was sent (s)",
    "first_partial": "receive time of an utterance's first partial - time the audio at its "
    "`start` was sent (s)",
    "lost": "reference utterance with no final of its participant overlapping its audio span",
    "spurious": "final overlapping no reference utterance",
    "duplicates": "extra copies of a final with an utterance_id already received",
    "wer": "(S + D + I) / reference words, references joined in order vs finals by start",
    "errors": "sessions that did not end cleanly, by close code (e.g. 1013), http_STATUS for "
    "a refused handshake, or connect_failed, no_session_started, drain_timeout, run_deadline",
    "send_lag": "per paced frame: time it left - time it was due (includes socket backpressure)",
    "loop_lag": "client event loop oversleep on a 50 ms timer: the client's own health",
    "server": "the finals' own `timing` (queue wait, batch inference, total), as the server saw it",
    "until_close": "per final with a `timing`: its latency - timing.total, the time from sending "
    "the audio at its `end` to the server closing the utterance (the silence that confirms "
    "the endpoint, VAD, transport) plus the final's way back",
    "partials_per_2s": "a room's partials received per 2 s of its reference speech",
}


def summarize(values: Iterable[float]) -> dict[str, float | int | None]:
    """Count, mean, min, max and P50/P90/P95/P99 (linear interpolation); None when empty."""
    data = np.asarray(list(values), dtype=np.float64)
    figures: dict[str, float | int | None] = {"count": int(data.size)}
    if data.size == 0:
        figures.update({"mean": None, "min": None, "max": None})
        figures.update({f"p{q}": None for q in PERCENTILES})
        return figures
    figures.update({"mean": float(data.mean()), "min": float(data.min()), "max": float(data.max())})
    for q, value in zip(PERCENTILES, np.percentile(data, PERCENTILES), strict=True):
        figures[f"p{q}"] = float(value)
    return figures


def overlaps(a_start: float, a_end: float, b_start: float, b_end: float) -> bool:
    """Whether two time spans share some time (touching ends do not count)."""
    return a_start < b_end and b_start < a_end


def first_copies(finals: Sequence[FinalEvent]) -> list[FinalEvent]:
    """The first final received for each utterance_id, in arrival order."""
    seen: set[str] = set()
    unique = []
    for event in finals:
        if event.message["utterance_id"] not in seen:
            seen.add(event.message["utterance_id"])
            unique.append(event)
    return unique


# Fewer finals than this say nothing about a backlog: with two finals a third, one long
# utterance late in a one-room run reads as growth (seen: 7 finals, "grew by 0.32 s").
TREND_MIN_POINTS = 12


def latency_trend(points: Sequence[tuple[float, float]]) -> float | None:
    """How much latency grew: median of the last third - median of the first third.

    `points` are (receive time, latency); None with fewer than `TREND_MIN_POINTS`.
    """
    if len(points) < TREND_MIN_POINTS:
        return None
    ordered = [latency for _, latency in sorted(points)]
    third = len(ordered) // 3
    return statistics.median(ordered[-third:]) - statistics.median(ordered[:third])


@dataclass(frozen=True, slots=True)
class SourceFigures:
    """What one participant's socket shows against that participant's references."""

    unique_finals: list[FinalEvent]
    duplicates: int
    lost: list[Utterance]
    spurious: int
    wer: ErrorCounts
    final_points: list[tuple[float, float]]  # (received, latency)
    partial_points: list[tuple[float, float]]
    first_partials: list[float]
    beyond_audio: int  # messages whose `end` lies past the audio sent
    server_timings: list[Timing]  # the finals' own `timing`, where the server sent it
    until_close: list[float]  # per final with a timing: latency - timing.total


def source_figures(log: SourceLog, references: Sequence[Utterance], language: str) -> SourceFigures:
    """Account one source's finals and partials against its reference utterances."""
    unique = first_copies(log.finals)
    lost = [
        ref
        for ref in references
        if not any(
            overlaps(ref.start, ref.end, f.message["start"], f.message["end"]) for f in unique
        )
    ]
    spurious = sum(
        1
        for f in unique
        if not any(
            overlaps(ref.start, ref.end, f.message["start"], f.message["end"]) for ref in references
        )
    )
    by_time = sorted(unique, key=lambda f: (f.message["start"], f.message["seq"]))
    wer = error_counts(
        " ".join(ref.text for ref in references),
        " ".join(f.message["text"] for f in by_time),
        language,
    )
    first_partial: dict[str, float] = {}
    for partial in log.partials:
        uid = partial.message["utterance_id"]
        if uid not in first_partial and partial.since_start is not None:
            first_partial[uid] = partial.since_start
    beyond = sum(1 for f in log.finals if f.latency is None) + sum(
        1 for p in log.partials if p.latency is None
    )
    return SourceFigures(
        unique_finals=unique,
        duplicates=len(log.finals) - len(unique),
        lost=lost,
        spurious=spurious,
        wer=wer,
        final_points=[(f.received, f.latency) for f in unique if f.latency is not None],
        partial_points=[(p.received, p.latency) for p in log.partials if p.latency is not None],
        first_partials=list(first_partial.values()),
        beyond_audio=beyond,
        server_timings=[f.message["timing"] for f in unique if "timing" in f.message],
        until_close=[
            f.latency - f.message["timing"]["total"]
            for f in unique
            if f.latency is not None and "timing" in f.message
        ],
    )


@dataclass(frozen=True, slots=True)
class RoomRun:
    """One room's plan and the logs of its sources (same order as `plan.participants`)."""

    plan: RoomPlan
    logs: tuple[SourceLog, ...]


@dataclass(frozen=True, slots=True)
class ClientHealth:
    loop_lags: Sequence[float]  # oversleep of a 50 ms timer on the client's event loop
    cpu_seconds: float  # process CPU time over the run
    wall_seconds: float


@dataclass(frozen=True, slots=True)
class Limits:
    """What a run must meet to pass (used by --slo-p95 and --find-max-rooms)."""

    slo_p95: float | None = None  # final latency P95, seconds
    max_client_lag: float = 0.1  # client loop lag P99 above this: the client fell behind
    max_trend_fraction: float = 0.25  # latency may grow by at most this x SLO over the run


def _counts_dict(counts: ErrorCounts) -> dict[str, int]:
    return {
        "substitutions": counts.substitutions,
        "deletions": counts.deletions,
        "insertions": counts.insertions,
        "reference_words": counts.reference_length,
    }


def _rounded(points: Iterable[tuple[float, ...]]) -> list[list[float]]:
    return [[round(v, 4) for v in point] for point in points]


def build_report(
    config: Mapping[str, Any],
    rooms: Sequence[RoomRun],
    client: ClientHealth,
    limits: Limits,
    language: str = "en",
) -> dict[str, Any]:
    """Every figure of a run, as a JSON-ready dict."""
    total_wer = ErrorCounts(0, 0, 0, 0)
    final_points: list[tuple[float, float, float]] = []
    partial_points: list[tuple[float, float]] = []
    first_partials: list[float] = []
    server_timings: list[Timing] = []
    until_close: list[float] = []
    errors: Counter[str] = Counter()
    server_errors: Counter[str] = Counter()
    room_rows = []
    totals: Counter[str] = Counter()
    send_lags: list[float] = []
    cadences: list[float] = []  # per room: partials per 2 s of speech
    for index, room in enumerate(rooms):
        room_wer = ErrorCounts(0, 0, 0, 0)
        room_points: list[tuple[float, float]] = []
        room_errors: Counter[str] = Counter()
        row_counts: Counter[str] = Counter()
        lost_rows = []
        for log in room.logs:
            refs = [u for u in room.plan.utterances if u.participant == log.participant]
            figures = source_figures(log, refs, language)
            room_wer += figures.wer
            room_points += figures.final_points
            final_points += [(t, lat, index) for t, lat in figures.final_points]
            partial_points += figures.partial_points
            first_partials += figures.first_partials
            server_timings += figures.server_timings
            until_close += figures.until_close
            send_lags += log.send_lags
            if log.failure is not None:
                room_errors[log.failure] += 1
            server_errors.update(e["code"] for e in log.server_errors)
            row_counts.update(
                utterances=len(refs),
                finals=len(figures.unique_finals),
                duplicates=figures.duplicates,
                lost=len(figures.lost),
                spurious=figures.spurious,
                partials=len(log.partials),
            )
            totals.update(
                beyond_audio=figures.beyond_audio,
                malformed=log.malformed,
                foreign=log.foreign,
                sources_connected=int(log.started is not None),
                sessions_clean=int(log.failure is None and log.ended is not None),
                samples_sent=log.clock.samples_sent,
            )
            lost_rows += [
                {"participant": u.participant, "clip": u.clip_id, "start": u.start, "end": u.end}
                for u in figures.lost
            ]
        totals.update(row_counts)
        errors.update(room_errors)
        total_wer += room_wer
        speech = sum(u.end - u.start for u in room.plan.utterances)
        cadence = 2 * row_counts["partials"] / speech if speech else None
        if cadence is not None:
            cadences.append(cadence)
        room_rows.append(
            {
                "room": index,
                "meeting_id": room.plan.meeting_id,
                "participants": len(room.plan.participants),
                "audio_seconds": room.plan.audio_seconds,
                **{k: row_counts[k] for k in ("utterances", "finals", "partials")},
                "speech_seconds": speech,
                "partials_per_2s": cadence,
                **{k: row_counts[k] for k in ("lost", "duplicates", "spurious")},
                "wer": room_wer.rate,
                "wer_counts": _counts_dict(room_wer),
                "final_latency": summarize(lat for _, lat in room_points),
                "errors": dict(room_errors),
                "lost_utterances": lost_rows,
            }
        )

    loop_lag = summarize(client.loop_lags)
    cpu_percent = 100.0 * client.cpu_seconds / client.wall_seconds if client.wall_seconds else 0.0
    lag_p99 = loop_lag["p99"]
    report: dict[str, Any] = {
        "version": REPORT_VERSION,
        "config": dict(config),
        "definitions": DEFINITIONS,
        "totals": {
            "rooms": len(rooms),
            "sources": sum(len(r.logs) for r in rooms),
            "sources_connected": totals["sources_connected"],
            "sessions_clean": totals["sessions_clean"],
            "audio_seconds_sent": totals["samples_sent"] / DEFAULT_SAMPLE_RATE,
            "wall_seconds": client.wall_seconds,
            **{
                k: totals[k]
                for k in ("utterances", "finals", "partials", "lost", "duplicates", "spurious")
            },
            **{k: totals[k] for k in ("beyond_audio", "malformed", "foreign")},
        },
        "latency": {
            "final": summarize(lat for _, lat, _ in final_points),
            "partial": summarize(lat for _, lat in partial_points),
            "first_partial": summarize(first_partials),
            "final_trend": latency_trend([(t, lat) for t, lat, _ in final_points]),
            "server": {
                part: summarize(timing[part] for timing in server_timings)
                for part in ("queue", "inference", "total")
            },
            "until_close": summarize(until_close),
        },
        "wer": {"overall": total_wer.rate, **_counts_dict(total_wer)},
        "partials_per_2s": summarize(cadences),  # per room
        "errors": dict(errors),
        "server_errors": dict(server_errors),
        "client": {
            "send_lag": summarize(send_lags),
            "loop_lag": loop_lag,
            "cpu_percent": cpu_percent,
            "fell_behind": lag_p99 is not None and float(lag_p99) > limits.max_client_lag,
        },
        "rooms": room_rows,
        "series": {
            "final": _rounded(sorted(final_points)),
            "partial": _rounded(sorted(partial_points)),
        },
    }
    report["verdict"] = verdict(report, limits)
    return report


def verdict(report: Mapping[str, Any], limits: Limits) -> dict[str, Any]:
    """Whether a run passes: P95 within the SLO, nothing lost, no errors, no growing lag."""
    reasons = []
    p95 = report["latency"]["final"]["p95"]
    totals = report["totals"]
    if p95 is None:
        reasons.append("no finals received")
    elif limits.slo_p95 is not None and p95 > limits.slo_p95:
        reasons.append(f"final latency P95 {p95:.3f} s > SLO {limits.slo_p95:g} s")
    if totals["lost"]:
        reasons.append(f"{totals['lost']} of {totals['utterances']} utterances lost")
    if report["errors"]:
        reasons.append("errors: " + ", ".join(f"{k}: {v}" for k, v in report["errors"].items()))
    trend = report["latency"]["final_trend"]
    if (
        limits.slo_p95 is not None
        and trend is not None
        and trend > limits.max_trend_fraction * limits.slo_p95
    ):
        reasons.append(f"final latency grew by {trend:.3f} s over the run")
    if report["client"]["fell_behind"]:
        reasons.append("the client fell behind (its own event loop lagged): result inconclusive")
    return {"slo_p95": limits.slo_p95, "passed": not reasons, "reasons": reasons}


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def render_summary(report: Mapping[str, Any]) -> str:
    """A short plain-text table of the report's headline figures (what the CLI prints)."""
    config, totals, latency = report["config"], report["totals"], report["latency"]
    speed = config.get("speed")
    lines = [
        f"Parley load: {totals['rooms']} rooms, {config.get('participants_per_room', 1)} "
        f"participant(s) each, speed {'max' if speed is None else f'{speed:g}x'}, "
        f"{totals['audio_seconds_sent']:.1f} s audio sent in {totals['wall_seconds']:.1f} s",
        "",
        f"{'latency (s)':<16}{'count':>7}"
        + "".join(f"{'p' + str(q):>9}" for q in PERCENTILES)
        + f"{'max':>9}",
    ]
    rows = [
        (name.replace("_", " "), latency[name]) for name in ("final", "partial", "first_partial")
    ]
    if latency["server"]["total"]["count"]:
        rows.append(("server total", latency["server"]["total"]))  # the finals' own `timing`
    for name, row in rows:
        lines.append(
            f"{name:<16}{row['count']:>7}"
            + "".join(f"{_fmt(row[f'p{q}']):>9}" for q in PERCENTILES)
            + f"{_fmt(row['max']):>9}"
        )
    wer, cadence = report["wer"], report["partials_per_2s"]
    room_wers = [r["wer"] for r in report["rooms"]]
    lines += [
        "",
        f"utterances {totals['utterances']}  finals {totals['finals']}  lost {totals['lost']}  "
        f"duplicates {totals['duplicates']}  spurious {totals['spurious']}  "
        f"partials {totals['partials']} (per 2 s of speech: room min "
        f"{_fmt(cadence['min'], 2)}, median {_fmt(cadence['p50'], 2)})",
        f"WER {_fmt(wer['overall'])} ({wer['reference_words']} words)"
        + (f"  rooms min {_fmt(min(room_wers))} max {_fmt(max(room_wers))}" if room_wers else ""),
        f"sessions clean {totals['sessions_clean']}/{totals['sources']}  errors "
        + (", ".join(f"{k}: {v}" for k, v in sorted(report["errors"].items())) or "none"),
    ]
    client = report["client"]
    lines.append(
        f"client: loop lag p99 {_fmt(client['loop_lag']['p99'])} s, send lag p99 "
        f"{_fmt(client['send_lag']['p99'])} s, cpu {client['cpu_percent']:.0f}%"
        + (" — FELL BEHIND, figures inconclusive" if client["fell_behind"] else "")
    )
    result = report["verdict"]
    if result["slo_p95"] is not None:
        status = "PASS" if result["passed"] else "FAIL: " + "; ".join(result["reasons"])
        lines.append(f"SLO final P95 ≤ {result['slo_p95']:g} s: {status}")
    return "\n".join(lines)
