"""`python -m loadgen.replay`: stream recorded audio through protocol v1 and save the transcript.

Each file becomes one participant's stream of the same meeting (a multi-track recording
replays with one file per speaker). Audio is decoded and resampled to 16 kHz mono s16,
sent in frames paced at real time, N x real time or as fast as the socket accepts,
followed by `finalize` and `stop`; finals print as they arrive, and once every source
has `session.ended` the transcript is written as JSON, TXT, SRT or VTT.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import secrets
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from loadgen.audio import AudioDecodeError, load_audio
from loadgen.cli import add_connection_arguments, stream_options
from loadgen.client import (
    FinalEvent,
    PartialEvent,
    SourceLog,
    StreamOptions,
    Track,
    stream_source,
)
from loadgen.report import first_copies, summarize
from wire.errors import ProtocolError
from wire.messages import Final, TranscriptFinal
from wire.query import validate_id
from wire.transcript import TranscriptFormat, render


def safe_name(text: str) -> str:
    """`text` in the id alphabet of protocol v1: 'Bob Smith (2)' → 'Bob_Smith_2_'."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text).lstrip("_.-")[:100] or "speaker"


def default_participants(files: Sequence[Path]) -> list[str]:
    """One name per file: 'speaker' for a single file, else the file stems, made unique."""
    if len(files) == 1:
        return ["speaker"]
    names: list[str] = []
    for path in files:
        base = safe_name(path.stem)
        name, n = base, 2
        while name in names:
            name, n = f"{base}-{n}", n + 1
        names.append(name)
    return names


def transcript(meeting_id: str, finals: Sequence[TranscriptFinal], fmt: TranscriptFormat) -> str:
    """The transcript rendered as the server's `GET .../transcript` renders it.

    Ordered by audio time (docs/protocol.md#one-meeting-timeline): `render` puts
    finals that carry `wall_time` in meeting time (wire/timeline.py); finals without it
    (an older server) by `start`, then `seq`. With several tracks, `seq` order is the
    order finals were ready.
    """
    ordered = sorted(finals, key=lambda f: (f["start"], f["seq"]))
    return render(meeting_id, [Final.from_message(f) for f in ordered], fmt)


def format_for(path: Path | None, name: str | None) -> TranscriptFormat:
    """`name` if given, else the format `path`'s extension names, else txt."""
    if name is not None:
        return TranscriptFormat(name)
    suffix = path.suffix.lower().lstrip(".") if path is not None else ""
    known = {f.value for f in TranscriptFormat}
    return TranscriptFormat(suffix) if suffix in known else TranscriptFormat.TXT


class LivePrinter:
    """Prints finals as they arrive; on a terminal, the latest partial on a line of its own."""

    def __init__(self, stream: TextIO, partials: bool) -> None:
        self.stream = stream
        self.partials = partials and stream.isatty()
        self.partial_shown = False

    def on_event(self, log: SourceLog, event: FinalEvent | PartialEvent) -> None:
        message = event.message
        if isinstance(event, PartialEvent):
            if self.partials:
                width = shutil.get_terminal_size().columns - 1
                line = f"… {log.participant}: {message['text'].strip()}"
                self.stream.write("\r\x1b[K" + line[:width])
                self.stream.flush()
                self.partial_shown = True
            return
        if self.partial_shown:
            self.stream.write("\r\x1b[K")
            self.partial_shown = False
        latency = "" if event.latency is None else f"  ({event.latency:.2f} s)"
        self.stream.write(
            f"[{message['start']:8.2f} → {message['end']:8.2f}] "
            f"{log.participant}: {message['text'].strip()}{latency}\n"
        )
        self.stream.flush()


async def replay(
    files: Sequence[Path],
    participants: Sequence[str],
    server: str,
    meeting_id: str,
    options: StreamOptions,
    printer: LivePrinter | None = None,
) -> list[SourceLog]:
    """Stream each file as one participant of `meeting_id`, all together; return the logs."""
    tracks = [Track((load_audio(path),)) for path in files]
    epoch = time.monotonic()

    def clock() -> float:
        return time.monotonic() - epoch

    logs = [SourceLog(meeting_id, name) for name in participants]
    await asyncio.gather(
        *(
            stream_source(
                log,
                server,
                track,
                options,
                clock=clock,
                on_event=printer.on_event if printer is not None else None,
            )
            for log, track in zip(logs, tracks, strict=True)
        )
    )
    return logs


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadgen.replay",
        description=(
            "Replay recorded audio through a Parley server (protocol v1) and write the "
            "transcript. Several files with one --participant each replay one multi-track "
            "meeting. WAV is read directly; mp3, m4a, flac, ogg and others are decoded by PyAV."
        ),
        epilog=(
            "examples:\n"
            "  python -m loadgen.replay standup.m4a --out standup.srt\n"
            "  python -m loadgen.replay ana.wav ben.flac --participant ana --participant ben "
            "--speed max --out meeting.vtt\n"
            "  python -m loadgen.replay talk.mp3 --speed 2 --format json > talk.json"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE", help="audio files")
    parser.add_argument("--meeting", help="meeting id (default replay-<first file>-<random>)")
    parser.add_argument(
        "--participant",
        action="append",
        metavar="NAME",
        help="participant name, once per file in order (default: 'speaker', or the file names)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="PATH",
        help="write the transcript here; without --out, --format prints it to stdout",
    )
    parser.add_argument(
        "--format",
        choices=[f.value for f in TranscriptFormat],
        help="transcript format (default: from --out's extension, else txt)",
    )
    parser.add_argument(
        "--no-partials", action="store_true", help="do not show partials on the terminal"
    )
    add_connection_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    files: list[Path] = args.files
    participants = args.participant or default_participants(files)
    if len(participants) != len(files):
        parser.error(
            f"{len(files)} files need {len(files)} --participant names, got {len(participants)}"
        )
    if len(set(participants)) != len(participants):
        parser.error("participant names must differ")
    meeting = args.meeting or f"replay-{safe_name(files[0].stem)[:80]}-{secrets.token_hex(3)}"
    try:
        validate_id("meeting id", meeting)
        for name in participants:
            validate_id("participant", name)
    except ProtocolError as exc:
        parser.error(exc.message)
    options = stream_options(args)
    fmt = format_for(args.out, args.format)
    printer = LivePrinter(
        sys.stderr if args.out is None and args.format else sys.stdout,
        partials=not args.no_partials,
    )
    try:
        logs = asyncio.run(replay(files, participants, args.server, meeting, options, printer))
    except AudioDecodeError as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    events = [event for log in logs for event in first_copies(log.finals)]
    text = transcript(meeting, [event.message for event in events], fmt)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
    elif args.format:
        sys.stdout.write(text)
    latency = summarize(event.latency for event in events if event.latency is not None)
    print(
        f"meeting {meeting}: {len(events)} finals"
        + (
            f", latency p50 {latency['p50']:.2f} s p95 {latency['p95']:.2f} s"
            if latency["count"]
            else ""
        )
        + (f"; transcript in {args.out}" if args.out is not None else ""),
        file=sys.stderr,
    )
    failed = [log for log in logs if log.failure is not None]
    for log in failed:
        print(f"{log.participant}: failed ({log.failure}) {log.detail}".rstrip(), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
