"""Checks shared by the load generator's CLI tests (stub server) and end-to-end tests."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path
from typing import Any

import av

from tests.support.corpus import REPO

SRT_TIME = r"(\d{2}):(\d{2}):(\d{2}),(\d{3})"


def srt_seconds(h: str, m: str, s: str, ms: str) -> float:
    return int(h) * 3600 + int(m) * 60 + int(s) + int(ms) / 1000


def parse_srt(text: str) -> list[tuple[float, float, str]]:
    """Cues of a SubRip file; AssertionError if it is not well-formed.

    Well-formed: blocks separated by one blank line, numbered 1, 2, ... in order,
    `HH:MM:SS,mmm --> HH:MM:SS,mmm` with start < end, non-decreasing starts, and text.
    """
    assert text.endswith("\n") and "\r" not in text, "SRT must end in a newline, LF only"
    cues: list[tuple[float, float, str]] = []
    for number, block in enumerate(text.rstrip("\n").split("\n\n"), start=1):
        lines = block.split("\n")
        assert len(lines) >= 3, f"cue {number} needs index, timing and text: {block!r}"
        assert lines[0] == str(number), f"cue {number} is numbered {lines[0]!r}"
        timing = re.fullmatch(f"{SRT_TIME} --> {SRT_TIME}", lines[1])
        assert timing, f"bad timing line {lines[1]!r}"
        start, end = srt_seconds(*timing.groups()[:4]), srt_seconds(*timing.groups()[4:])
        assert start < end, f"cue {number} ends before it starts"
        assert all(line.strip() for line in lines[2:]), f"cue {number} has an empty line"
        if cues:
            assert start >= cues[-1][0], f"cue {number} starts before cue {number - 1}"
        cues.append((start, end, " ".join(lines[2:])))
    return cues


def summary_rows(stdout: str) -> dict[str, list[str]]:
    """The latency rows of the printed summary: name → [count, p50, p90, p95, p99, max]."""
    rows = {}
    for name in ("final", "partial", "first partial"):
        match = re.search(rf"^{name}\s+(\d+)((?:\s+(?:[\d.]+|-)){{5}})\s*$", stdout, re.M)
        assert match, f"no {name!r} row in:\n{stdout}"
        rows[name] = [match[1], *match[2].split()]
    return rows


def assert_summary_matches(stdout: str, report: dict[str, Any]) -> None:
    """Every latency figure printed equals the JSON report's, rounded to milliseconds."""
    for name, printed in summary_rows(stdout).items():
        figures = report["latency"][name.replace(" ", "_")]
        assert int(printed[0]) == figures["count"], name
        for text, key in zip(printed[1:], ("p50", "p90", "p95", "p99", "max"), strict=True):
            expected = "-" if figures[key] is None else f"{figures[key]:.3f}"
            assert text == expected, f"{name} {key}: printed {text}, report {expected}"
    totals = report["totals"]
    for key in ("utterances", "finals", "lost", "duplicates", "spurious", "partials"):
        assert re.search(rf"\b{key} {totals[key]}\b", stdout), f"{key} {totals[key]} not printed"
    assert f"WER {report['wer']['overall']:.3f}" in stdout


async def run_module(*args: str, timeout: float) -> tuple[int, str, str]:
    """Run `python -m ARGS` from the repository root; (exit code, stdout, stderr)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        *args,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(timeout):
            out, err = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def to_flac(source: Path, target: Path) -> Path:
    """Re-encode a 16 kHz mono audio file as FLAC (lossless), with PyAV."""
    with av.open(str(source)) as reader, av.open(str(target), "w") as writer:
        stream = writer.add_stream("flac", rate=16_000, layout="mono")
        for frame in reader.decode(audio=0):
            frame.pts = None
            writer.mux(stream.encode(frame))
        writer.mux(stream.encode(None))
    return target
