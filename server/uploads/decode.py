"""Decode an uploaded file in a sandboxed subprocess: untrusted bytes in, 16 kHz PCM out.

`decode_file()` runs server/uploads/decode_worker.py under `python -I` with a minimal
environment, its own session (so the whole group can be killed) and a wall-clock limit,
inside the sandbox (server/uploads/sandbox.py: bubblewrap namespaces and seccomp, no network,
nothing of the host's files but the upload and the output); the worker lowers its own
CPU, memory and output-size limits before it reads the file.
The result is a raw mono pcm_s16le file at 16 kHz on disk: the server never holds a
whole recording in memory, and reads it back in chunks.

Every way the decode can fail becomes a Refusal with the HTTP status, code and
reason the client gets: the worker's own refusals (415 unsupported format, 422 damaged,
truncated or too long), and the limits that stopped it (422 `decode_limit`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.api import SAMPLE_RATE
from server.uploads import decode_worker
from server.uploads.decode_worker import Refusal
from server.uploads.sandbox import EXIT_SIGNAL_BASE, UNCONFINED, Sandbox

logger = logging.getLogger(__name__)

WORKER = Path(decode_worker.__file__).resolve()
OUTPUT_RATE = decode_worker.OUTPUT_RATE  # the isolated worker cannot import the model's
assert OUTPUT_RATE == SAMPLE_RATE, "uploads decode to the model's rate"
MAX_REPORT_BYTES = 64 << 10  # stdout/stderr kept from the worker


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    max_seconds: float  # decoded duration cap
    cpu_seconds: int
    memory_bytes: int
    wall_seconds: float


@dataclass(frozen=True, slots=True)
class DecodedAudio:
    path: Path  # raw pcm_s16le, mono, 16 kHz
    samples: int
    format: str  # FFmpeg's demuxer name
    codec: str
    source_rate: int
    channels: int
    decode_seconds: float  # wall time of the subprocess

    @property
    def seconds(self) -> float:
        return self.samples / OUTPUT_RATE


_SIGNALS: dict[int, str] = {
    signal.SIGXCPU: "its CPU-time limit",
    signal.SIGXFSZ: "its output-size limit",
    signal.SIGKILL: "its CPU-time or memory limit",
    signal.SIGSEGV: "a crash",
    signal.SIGABRT: "a crash",
}


async def decode_file(
    src: Path, dst: Path, limits: DecodeLimits, sandbox: Sandbox = UNCONFINED
) -> DecodedAudio:
    """Decode `src` into raw 16 kHz mono s16le at `dst`, or raise Refusal."""
    started = time.monotonic()
    argv = [
        sys.executable,
        "-I",  # no PYTHON* variables, no user site, no script directory on sys.path
        str(WORKER),
        "--max-seconds",
        str(limits.max_seconds),
        "--cpu-seconds",
        str(limits.cpu_seconds),
        "--memory-bytes",
        str(limits.memory_bytes),
        str(src),
        str(dst),
    ]
    await asyncio.to_thread(dst.touch)  # the sandbox binds the output file: it must exist
    with sandbox.command(argv, read=[WORKER, src], write=[dst]) as (command, fds):
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=_worker_env(),
            start_new_session=True,
            pass_fds=fds,
        )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), limits.wall_seconds)
    except TimeoutError:
        raise Refusal(
            422,
            "decode_limit",
            f"decoding the file took longer than {limits.wall_seconds:.0f} s; refused",
        ) from None
    finally:
        if process.returncode is None:  # timed out or cancelled: stop the whole group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
    elapsed = time.monotonic() - started
    report = _report(stdout[:MAX_REPORT_BYTES])
    if process.returncode == 0 and report is not None and report.get("ok") is True:
        return DecodedAudio(
            path=dst,
            samples=int(report["samples"]),
            format=str(report["format"]),
            codec=str(report["codec"]),
            source_rate=int(report["sample_rate"]),
            channels=int(report["channels"]),
            decode_seconds=elapsed,
        )
    if process.returncode == decode_worker.EXIT_REFUSED and report is not None:
        if int(report["status"]) >= 500:  # the decoder's own failure, not the file's
            logger.error("decoder could not run: %s", report["message"])
        raise Refusal(int(report["status"]), str(report["code"]), str(report["message"]))
    code = process.returncode or 0
    detail = stderr[-MAX_REPORT_BYTES:].decode(errors="replace")
    if sandbox.confined and detail.startswith("bwrap:"):
        logger.error("the decoder sandbox could not start: %s", detail.strip())
        raise Refusal(500, "internal", "the decoder could not start; see server log")
    if code > EXIT_SIGNAL_BASE and sandbox.confined:  # bwrap reports a signal as 128 + N
        code = EXIT_SIGNAL_BASE - code
    if code < 0:
        cause = _SIGNALS.get(-code, f"signal {-code}")
        logger.warning("decoder stopped by %s after %.1f s", cause, elapsed)
        raise Refusal(422, "decode_limit", f"decoding the file was stopped by {cause}")
    logger.error("decoder failed with exit code %s: %s", code, detail)
    raise Refusal(422, "invalid_audio", "the file could not be decoded")


def _report(stdout: bytes) -> dict[str, Any] | None:
    lines = stdout.strip().splitlines()
    if not lines:
        return None
    try:
        report = json.loads(lines[-1])
    except ValueError:
        return None
    return report if isinstance(report, dict) else None


def _worker_env() -> dict[str, str]:
    """Nothing of the server's environment (secrets, Redis URL) reaches the decoder."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
    }
