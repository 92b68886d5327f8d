"""Live rooms' final latency with and without a file upload running beside them.

Starts a real server (real model) per setting, streams N rooms of corpus speech in real
time, and — in the second run of each pair — uploads a long recording first so it is
being transcribed while the rooms speak. Prints per-run final latency as the client
sees it (arrival − the wall time its audio `end` was sent) and the server's
`timing.total`, plus the upload's processing speed.

    python -m bench.upload_live --rooms 2 \
        --runs UPLOAD_LIVE_SHARE=1 UPLOAD_LIVE_SHARE=0.5 UPLOAD_IN_FLIGHT_LIVE=4,UPLOAD_LIVE_SHARE=1

Each run is a comma-separated list of PARLEY_* settings (without the prefix).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from tests.support import audiofiles
from tests.support.corpus import clip
from tests.support.httpclient import get, upload
from tests.support.servers import start_server
from tests.support.wsclient import BYTES_PER_SECOND, stream_pcm

ROOM_CLIPS = [  # two clips a room, ~25-30 s of speech each
    ("en_ls_1221-135766-0001", "en_jfk"),
    ("en_ls_2412-153948-0000", "en_lj_LJ001-0001"),
    ("en_mfa_surround", "en_lj_LJ001-0003"),
    ("en_lj_LJ001-0005", "en_ls_1272-128104-0000"),
]
FILE_CLIP = "en_lj_longform_LJ001-0001_0020"  # 137 s


async def room(base: str, meeting: str, pcm: bytes) -> tuple[list[float], list[float]]:
    """(client latencies, server timing.total) of one real-time stream's finals."""
    result = await stream_pcm(base, meeting, pcm, participant="p", drain_timeout=300)
    return result.final_latencies, [f["timing"]["total"] for f in result.finals]


async def run(base: str, rooms: int, with_upload: bool, recording: bytes) -> dict[str, Any]:
    location = None
    if with_upload:
        response = await upload(base, recording, "long.mp3")
        assert response.status == 202, response.body
        location = response.headers["location"]
        await asyncio.sleep(1.0)
    gap = bytes(BYTES_PER_SECOND)
    pcms = [clip(a).pcm16() + gap + clip(b).pcm16() + gap for a, b in ROOM_CLIPS[:rooms]]
    results = await asyncio.gather(
        *(room(base.replace("http", "ws"), f"bench-{time.time_ns()}-{i}", p)
          for i, p in enumerate(pcms))
    )  # fmt: skip
    client = [x for c, _ in results for x in c]
    server = [x for _, s in results for x in s]
    job: dict[str, Any] = {}
    if location is not None:
        while True:
            job = (await get(base + location)).json()
            if job["status"] in {"done", "failed"}:
                break
            await asyncio.sleep(0.5)
    return {"client": client, "server": server, "job": job}


def summary(values: list[float]) -> str:
    if not values:
        return "none"
    ordered = sorted(values)
    return (
        f"median {statistics.median(ordered):.2f} s, p90 "
        f"{ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]:.2f} s, "
        f"max {ordered[-1]:.2f} s (n={len(ordered)})"
    )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--runs", nargs="+", default=["UPLOAD_LIVE_SHARE=1", "UPLOAD_LIVE_SHARE=0.5"]
    )
    parser.add_argument("--rounds", type=int, default=1, help="alone/beside pairs per run")
    parser.add_argument("--rooms", type=int, default=2)
    args = parser.parse_args()
    recording = audiofiles.encode(clip(FILE_CLIP).samples(), "mp3")
    for spec in args.runs:
        env = {"PARLEY_" + k: v for k, v in (item.split("=", 1) for item in spec.split(","))}
        server = await asyncio.to_thread(start_server, env)
        alone: dict[str, list[float]] = {"client": [], "server": []}
        beside: dict[str, list[float]] = {"client": [], "server": []}
        jobs = []
        try:
            base = server.http_url
            await run(base, 1, False, recording)  # warm the server's paths
            for _ in range(args.rounds):
                for into, with_upload in ((alone, False), (beside, True)):
                    result = await run(base, args.rooms, with_upload, recording)
                    into["client"] += result["client"]
                    into["server"] += result["server"]
                    if with_upload:
                        jobs.append(result["job"])
        finally:
            server.stop()
        print(f"{spec}, {args.rooms} live rooms")
        print(f"  alone          client {summary(alone['client'])}")
        print(f"                 server {summary(alone['server'])}")
        print(f"  beside upload  client {summary(beside['client'])}")
        print(f"                 server {summary(beside['server'])}")
        for job in jobs:
            print(f"  upload {job.get('duration')} s audio: {job.get('timing')}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
