"""`python -m loadgen`: N concurrent rooms of real speech against a protocol v1 server."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import orjson

from loadgen.cli import (
    add_connection_arguments,
    language,
    non_negative_float,
    positive_float,
    positive_int,
    stream_options,
)
from loadgen.corpus import CORPUS_ENV, default_corpus_dir
from loadgen.report import Limits, render_summary
from loadgen.run import LoadSettings, SearchSettings, find_max_rooms, run_load, write_report


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadgen",
        description=(
            "Stream real speech from the corpus into N concurrent rooms of a Parley (protocol "
            "v1) server, measure latency (receive time - send time of the audio at a final's "
            "end), WER, lost and duplicate finals and errors, and write a JSON + HTML report. "
            "With --find-max-rooms, search for the most rooms whose final-latency P95 stays "
            "within --slo-p95."
        ),
        epilog=(
            "examples:\n"
            "  python -m loadgen --rooms 10 --duration 120\n"
            "  python -m loadgen --rooms 4 --participants-per-room 3 --server ws://gpu-box:8000\n"
            "  python -m loadgen --find-max-rooms --slo-p95 1.2 --duration 60 --max-rooms 128"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    load = parser.add_argument_group("load")
    load.add_argument("--rooms", type=positive_int, default=1, help="concurrent rooms (default 1)")
    load.add_argument(
        "--participants-per-room",
        type=positive_int,
        default=1,
        metavar="K",
        help="sources per room; they speak in turns (default 1)",
    )
    load.add_argument(
        "--duration",
        type=positive_float,
        default=60.0,
        metavar="S",
        help="seconds of conversation per room: whole clips while they fit (default 60)",
    )
    load.add_argument(
        "--ramp",
        type=non_negative_float,
        default=None,
        metavar="S",
        help="spread room starts over S seconds (default min(10, duration/4))",
    )
    load.add_argument(
        "--corpus",
        type=Path,
        default=None,
        help=f"corpus folder with manifest.jsonl (default ${CORPUS_ENV} or {default_corpus_dir()})",
    )
    load.add_argument(
        "--max-clip-seconds",
        type=positive_float,
        default=30.0,
        metavar="S",
        help="skip corpus clips longer than this (default 30)",
    )
    load.add_argument(
        "--corpus-language",
        type=language,
        default=None,
        metavar="CODE",
        help="play and score the corpus clips of this language (default: --language, "
        "or en with --language auto)",
    )
    load.add_argument("--seed", type=int, default=0, help="seed for the silences (default 0)")
    add_connection_arguments(parser)
    out = parser.add_argument_group("report")
    out.add_argument(
        "--report-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="where report.json and report.html go (default reports/loadgen-TIMESTAMP)",
    )
    out.add_argument(
        "--no-progress", action="store_true", help="no progress bar (it shows on a terminal only)"
    )
    search = parser.add_argument_group("capacity search")
    search.add_argument(
        "--find-max-rooms",
        action="store_true",
        help="double the rooms from --rooms until a run fails the SLO, then bisect",
    )
    search.add_argument(
        "--slo-p95",
        type=positive_float,
        default=None,
        metavar="S",
        help="final-latency P95 limit in seconds (required by --find-max-rooms; "
        "also gives a plain run a pass/fail verdict)",
    )
    search.add_argument(
        "--max-rooms",
        type=positive_int,
        default=256,
        help="upper bound for --find-max-rooms (default 256)",
    )
    search.add_argument(
        "--search-budget",
        type=positive_float,
        default=1800.0,
        metavar="S",
        help="no search trial starts that would end later than S seconds in (default 1800)",
    )
    search.add_argument(
        "--max-client-lag",
        type=positive_float,
        default=0.1,
        metavar="S",
        help="client event-loop lag P99 above which the client itself fell behind (default 0.1)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.find_max_rooms and args.slo_p95 is None:
        build_parser().error("--find-max-rooms needs --slo-p95")
    settings = LoadSettings(
        server=args.server,
        rooms=args.rooms,
        participants_per_room=args.participants_per_room,
        corpus=args.corpus if args.corpus is not None else default_corpus_dir(),
        duration_s=args.duration,
        ramp_s=args.ramp,
        max_clip_s=args.max_clip_seconds,
        corpus_language=args.corpus_language,
        seed=args.seed,
        stream=stream_options(args),
        progress=not args.no_progress,
    )
    limits = Limits(slo_p95=args.slo_p95, max_client_lag=args.max_client_lag)
    report_dir = args.report_dir or Path("reports") / time.strftime("loadgen-%Y%m%d-%H%M%S")
    try:
        if args.find_max_rooms:
            return _search(
                settings,
                limits,
                SearchSettings(args.rooms, args.max_rooms, args.search_budget),
                report_dir,
            )
        report = asyncio.run(run_load(settings, limits))
    except (FileNotFoundError, ValueError) as exc:
        print(f"loadgen: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    print(render_summary(report))
    for path in write_report(report, report_dir):
        print(f"wrote {path}", file=sys.stderr)
    return 0 if report["verdict"]["passed"] else 1


def _search(
    settings: LoadSettings, limits: Limits, search: SearchSettings, report_dir: Path
) -> int:
    def on_trial(rooms: int, report: dict[str, object]) -> None:
        verdict = report["verdict"]
        assert isinstance(verdict, dict)
        status = "pass" if verdict["passed"] else "fail: " + "; ".join(verdict["reasons"])
        print(f"{rooms} rooms: {status}", file=sys.stderr)

    summary, best = asyncio.run(find_max_rooms(settings, limits, search, on_trial))
    if best is not None:
        print(render_summary(best))
    lines = [f"{'rooms':>6} {'p50':>7} {'p95':>7} {'p99':>7}  result"]
    for step in summary["steps"]:
        figures = " ".join(
            f"{'-' if step[k] is None else format(step[k], '.3f'):>7}"
            for k in ("final_p50", "final_p95", "final_p99")
        )
        lines.append(f"{step['rooms']:>6} {figures}  {'pass' if step['passed'] else 'fail'}")
    print("\n".join(lines))
    print(
        f"max rooms with final P95 ≤ {limits.slo_p95:g} s: {summary['max_rooms']} "
        f"({summary['stopped']})"
    )
    if best is not None:
        paths = write_report(best, report_dir, summary)
    else:
        report_dir.mkdir(parents=True, exist_ok=True)
        paths = [report_dir / "search.json"]
        paths[0].write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    for path in paths:
        print(f"wrote {path}", file=sys.stderr)
    return 0 if summary["max_rooms"] >= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
