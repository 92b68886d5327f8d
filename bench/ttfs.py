"""TTFS, the public method of pipecat's stt-benchmark, Finalize-driven, over Deepgram's protocol.

    python -m bench.ttfs --clips 27                         # alone, then beside 8 rooms
    python -m bench.ttfs --clips 5 --rooms 0 PARLEY_SPECULATE_AFTER_MS=0

TTFS (time to final segment, github.com/pipecat-ai/stt-benchmark, its measuring-ttfs page)
is the receipt of the last final transcript segment minus the moment the user stopped
speaking, as the client's Silero VAD sees it: its stop event minus its `stop_secs` (0.2 s).
The client sends Deepgram's `Finalize` at each VAD stop, as pipecat's `DeepgramSTTService`
does on `VADUserStoppedSpeakingFrame`.

`--client parley` (the default) follows that method with our own Deepgram-protocol
client: each corpus clip, then `--tail` seconds of silence, is
sent to `/v1/listen` in 20 ms frames at real time, one clip at a time; the VAD is Silero
(the same ONNX model the server loads, run over the clip beforehand, which gives the same
probabilities as running it live) with pipecat's `VADParams` defaults: speech at
confidence >= 0.7, start after 0.2 s of it, stop after `stop_secs` without it (pipecat's
volume gate, `min_volume`, is left out). The last final (`is_final`) that arrives before
the stream's `Metadata` is the clip's last segment. WER is pooled over the clips heard to
their end (the finals joined, against the manifest's reference); a clip refused or cut short
is counted apart. `--client pipecat` streams each clip through pipecat's own Silero VAD
and `DeepgramSTTService` instead, as the benchmark does, and takes its TTFS as the
benchmark does (bench/ttfs_pipecat.py; pipecat-ai is a dev extra).

`--rooms 0,8`: alone, then beside 8 rooms of corpus meetings (`python -m loadgen`, real
time, partials on) started first and kept running through the clips. The server's own
side is read from `/metrics`: `parley_flush_seconds` (a flush's receipt → its final sent,
by what served it: a speculation ready at the flush, one unfinished, a decoding at the
flush). Each KEY=VALUE argument is a server environment variable. Rows go to stdout
and to `REPORT_DIR/ttfs.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from bench.capacity import REPO, scrape, wait_ready
from bench.processes import free_port
from loadgen.audio import load_audio
from loadgen.corpus import Clip, default_corpus_dir, load_manifest, select_clips
from loadgen.wer import error_counts
from session.vad import WINDOW, SileroVad, VadState

RATE = 16_000
FRAME = RATE // 50  # 20 ms of samples per binary frame
WINDOW_S = WINDOW / RATE


@dataclass(frozen=True, slots=True)
class VadParams:
    """pipecat's `VADParams` defaults (its `min_volume` gate aside)."""

    confidence: float = 0.7
    start_secs: float = 0.2
    stop_secs: float = 0.2


def vad_stops(samples: np.ndarray[Any, np.dtype[np.float32]], params: VadParams) -> list[int]:
    """The sample at which pipecat's VAD state machine (QUIET → STARTING → SPEAKING →
    STOPPING → QUIET) says the user stopped speaking, for each turn."""
    model, state = SileroVad(), VadState()
    start_windows = round(params.start_secs / WINDOW_S)
    stop_windows = round(params.stop_secs / WINDOW_S)
    speaking, count, stops = False, 0, []
    for i in range(len(samples) // WINDOW):
        window = samples[i * WINDOW : (i + 1) * WINDOW][None, :]
        speech = float(model.score(window, [state])[0]) >= params.confidence
        if speaking:
            count = 0 if speech else count + 1
            if count >= stop_windows:
                speaking, count = False, 0
                stops.append((i + 1) * WINDOW)
        else:
            count = count + 1 if speech else 0
            if count >= start_windows:
                speaking, count = True, 0
    return stops


@dataclass(slots=True)
class ClipRun:
    clip: str
    ttfs: float | None = None
    text: str = ""
    finals: list[tuple[float, str, bool]] = field(default_factory=list)  # with from_finalize
    flushes: list[float] = field(default_factory=list)  # when each Finalize was sent
    answer: float | None = None  # the last final's receipt minus the last Finalize's sending
    by_flush: bool = False  # the last final answered a Finalize (not the server's endpoint)
    error: str = ""  # why the clip did not run to its end (refused, timed out)
    # the last final's receipt minus the speech end: our client's TTFS; beside pipecat's
    # metric (`--client pipecat`), the check on it
    last_final: float | None = None


async def run_clip(url: str, clip: Clip, params: VadParams, tail: float) -> ClipRun:
    """Stream one clip at real time, Finalize at each VAD stop; its TTFS and text."""
    pcm = load_audio(clip.path)
    pcm = np.concatenate([pcm, np.zeros(round(tail * RATE), np.int16)])
    stops = set(vad_stops(pcm.astype(np.float32) / np.float32(32768), params))
    run = ClipRun(clip.id)
    query = "encoding=linear16&sample_rate=16000&channels=1&interim_results=true&punctuate=true"
    async with connect(f"{url}/v1/listen?{query}") as socket:

        async def receive() -> None:
            async for raw in socket:
                message = orjson.loads(raw)
                if message.get("type") == "Metadata":
                    return
                if message.get("type") == "Results" and message.get("is_final"):
                    text = message["channel"]["alternatives"][0]["transcript"]
                    flushed = bool(message.get("from_finalize"))
                    run.finals.append((time.monotonic(), text, flushed))

        receiver = asyncio.create_task(receive())
        started = time.monotonic()
        speech_end: float | None = None
        for offset in range(0, len(pcm), FRAME):
            due = started + offset / RATE
            if (delay := due - time.monotonic()) > 0:
                await asyncio.sleep(delay)
            await socket.send(pcm[offset : offset + FRAME].tobytes())
            sent = offset + FRAME
            if any(offset < stop <= sent for stop in stops):
                await socket.send(orjson.dumps({"type": "Finalize"}).decode())
                run.flushes.append(time.monotonic())
                speech_end = run.flushes[-1] - params.stop_secs
        await socket.send(orjson.dumps({"type": "CloseStream"}).decode())
        await asyncio.wait_for(receiver, 30)
    segments = [final for final in run.finals if final[1].strip()]
    run.text = " ".join(text for _, text, _ in segments)
    if segments and speech_end is not None:
        run.ttfs = run.last_final = segments[-1][0] - speech_end
        run.answer = segments[-1][0] - run.flushes[-1]
        run.by_flush = segments[-1][2]
    return run


def flush_figures(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """The server's flush → final times between two scrapes: P50/P95 (interpolated in
    `parley_flush_seconds`' buckets) and how many flushes each path served."""
    by_bound: dict[float, float] = {}
    served: dict[str, int] = {}
    speculations: dict[str, int] = {}  # by outcome: used, discarded, cancelled
    for key, value in after.items():
        grew = value - before.get(key, 0.0)
        if key.startswith("parley_flush_seconds_bucket{"):
            bound = float(key.split('le="')[1].split('"')[0])
            by_bound[bound] = by_bound.get(bound, 0.0) + grew
        elif key.startswith("parley_flush_seconds_count{"):
            served[key.split('served="')[1].split('"')[0]] = round(grew)
        elif key.startswith("parley_speculative_finals_total{"):
            speculations[key.split('outcome="')[1].split('"')[0]] = round(grew)
    buckets = sorted(by_bound.items())
    total = buckets[-1][1] if buckets else 0.0
    figures: dict[str, Any] = {"served": served, "speculations": speculations}
    for q in (0.5, 0.95):
        lower, below = 0.0, 0.0
        for bound, count in buckets:
            if total and count >= q * total:
                if bound == float("inf"):
                    figures[f"p{round(q * 100)}"] = None
                else:
                    share = (q * total - below) / max(count - below, 1e-9)
                    figures[f"p{round(q * 100)}"] = round(lower + share * (bound - lower), 4)
                break
            lower, below = bound, count
    return figures


def summary(
    rooms: int, runs: list[ClipRun], clips: list[Clip], flush: dict[str, Any]
) -> dict[str, Any]:
    ttfs = [r.ttfs for r in runs if r.ttfs is not None]
    q = np.percentile(ttfs, [50, 95, 99]) if ttfs else [float("nan")] * 3
    errors = words = 0
    for run, clip in zip(runs, clips, strict=True):
        if run.error:  # not heard to its end: its WER would say nothing of the model
            continue
        counts = error_counts(clip.reference_text, run.text)
        errors += counts.errors
        words += counts.reference_length
    return {
        "rooms": rooms,
        "clips": len(runs),
        "answered": len(ttfs),
        "ttfs_p50": round(float(q[0]), 3),
        "ttfs_p95": round(float(q[1]), 3),
        "ttfs_p99": round(float(q[2]), 3),
        "wer": round(errors / max(words, 1), 4),
        "flush": flush,
        "failed": sum(1 for r in runs if r.error),
        "per_clip": [
            {
                "clip": r.clip,
                "ttfs": r.ttfs,
                "finalize_to_final": r.answer,
                "last_final_answered_a_flush": r.by_flush,
                "last_final_minus_speech_end": r.last_final,
                "text": r.text,
                "error": r.error,
            }
            for r in runs
        ],
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| rooms beside | clips | TTFS P50 | P95 | P99 | pooled WER | flush→final P50 | P95 "
        "| flushes served | speculations | clips failed |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        f = r["flush"]
        served = ", ".join(f"{k} {v}" for k, v in sorted(f["served"].items()))
        speculations = ", ".join(f"{k} {v}" for k, v in sorted(f["speculations"].items()))
        lines.append(
            f"| {r['rooms']} | {r['answered']}/{r['clips']} | {r['ttfs_p50']:.3f} s "
            f"| {r['ttfs_p95']:.3f} s | {r['ttfs_p99']:.3f} s | {r['wer']:.1%} "
            f"| {_ms(f.get('p50'))} | {_ms(f.get('p95'))} | {served} | {speculations or '–'} "
            f"| {r['failed']} |"
        )
    return "\n".join(lines)


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1000:.0f} ms"


async def measure(args: argparse.Namespace, url: str, report_dir: Path) -> list[dict[str, Any]]:
    clips = select_clips(load_manifest(Path(args.corpus)), "en", args.max_clip_seconds)
    clips = clips[: args.clips]
    params = VadParams(stop_secs=args.stop_secs)
    stream = run_clip
    if args.client == "pipecat":
        from bench import ttfs_pipecat  # pipecat-ai: a dev extra, imported only for it

        stream = ttfs_pipecat.run_clip
    rows = []
    for rooms in args.rooms:
        load = None
        if rooms:
            load = await asyncio.create_subprocess_exec(
                *(sys.executable, "-m", "loadgen", "--rooms", str(rooms), "--server", url),
                *("--duration", str(args.load_duration), "--no-progress"),
                *("--report-dir", str(report_dir / f"load-{rooms}")),
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            await asyncio.sleep(args.warmup)  # the rooms ramp up and start speaking
        before = scrape(url)
        runs = []
        for clip in clips:
            try:
                run = await stream(url.replace("http", "ws", 1), clip, params, args.tail)
            except (OSError, TimeoutError, InvalidStatus, ConnectionClosed) as exc:
                run = ClipRun(clip.id, error=f"{type(exc).__name__}: {exc}")
            runs.append(run)
            check = run.last_final
            apart = check is not None and (run.ttfs is None or abs(check - run.ttfs) > 0.01)
            print(
                f"  {rooms} rooms {clip.id}: TTFS {_ms(run.ttfs)} (Finalize → final "
                f"{_ms(run.answer)}; {len(run.flushes)} flushes"
                f"{'' if run.by_flush else '; the last final was no flush answer'}"
                f"{f'; the last final − speech end {_ms(check)}' if apart else ''}) {run.error}",
                flush=True,
            )
        flush = flush_figures(before, scrape(url))
        if load is not None:
            load.terminate()
            await load.wait()
        rows.append(summary(rooms, runs, clips, flush))
        print(markdown(rows[-1:]), flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("settings", nargs="*", help="KEY=VALUE server environment variables")
    parser.add_argument("--clips", type=int, default=5, help="first N English corpus clips")
    parser.add_argument("--max-clip-seconds", type=float, default=30.0)
    parser.add_argument("--corpus", default=str(default_corpus_dir()))
    parser.add_argument(
        "--rooms",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[0, 8],
        help="rooms of meetings beside the clips, one run each (0: alone)",
    )
    parser.add_argument("--stop-secs", type=float, default=0.2, help="the client VAD's stop")
    parser.add_argument("--tail", type=float, default=1.0, help="silence after each clip")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds of load first")
    parser.add_argument("--load-duration", type=float, default=600.0)
    parser.add_argument("--report-dir", default="reports/ttfs")
    parser.add_argument(
        "--client",
        choices=["parley", "pipecat"],
        default="parley",
        help="our Deepgram-protocol client, or pipecat's Silero VAD and DeepgramSTTService",
    )
    args = parser.parse_args()
    env = dict(os.environ, PARLEY_LOG_LEVEL="warning")
    env.update(item.partition("=")[::2] for item in args.settings)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    report_dir = Path(args.report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    with open(report_dir / "server.log", "wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "server", "--port", str(port)],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            wait_ready(url, server)
            print("settings:", " ".join(args.settings) or "(defaults)", flush=True)
            print("client:", args.client, flush=True)
            rows = asyncio.run(measure(args, url, report_dir))
        finally:
            server.terminate()
            server.wait(60)
    (report_dir / "ttfs.json").write_bytes(
        orjson.dumps(
            {"settings": args.settings, "client": args.client, "rows": rows},
            option=orjson.OPT_INDENT_2,
        )
    )
    print()
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
