"""How an upload's scheduling policy affects live finals, with a simulated model.

On a shared machine the real model's speed swings with whatever else runs, which
drowns the effect being measured. Here the recognizer *sleeps* for what a batch would
cost (a CPU's cost model: a fixed part plus a part per
utterance, scaled by the encoder window the batch's longest utterance needs), so model
time is deterministic and uses no CPU, while everything else is real: the server, the
live rooms' WebSockets and VAD, the upload's decoder, VAD and scheduler traffic.

    python -m bench.upload_policy --rooms 2 --policies 8,1 4,1 1,1 1,0.5
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.upload_live import FILE_CLIP, ROOM_CLIPS, room, summary
from engine.api import Transcription, Utterance
from tests.server.test_uploads import serve
from tests.support import audiofiles
from tests.support.corpus import clip
from tests.support.httpclient import get, upload
from tests.support.wsclient import BYTES_PER_SECOND

WINDOWS = (10.0, 15.0, 20.0, 30.0)


class SleepyRecognizer:
    """Costs model time without using the CPU: base + per utterance, × window / 10 s."""

    def __init__(self, base: float, per_item: float) -> None:
        self.base = base
        self.per_item = per_item

    @property
    def name(self) -> str:
        return "sleepy"

    @property
    def max_batch_size(self) -> int:
        return 16

    def warmup(self) -> None:
        return None

    def transcribe(
        self, batch: Sequence[Utterance], should_stop: Callable[[], bool] | None = None
    ) -> list[Transcription]:
        longest = max(u.duration for u in batch)
        window = next((w for w in WINDOWS if longest + 0.5 <= w), WINDOWS[-1])
        time.sleep((self.base + self.per_item * len(batch)) * window / 10.0)
        return [
            Transcription(f"n={len(u.audio)}", "en", avg_logprob=-0.1, no_speech_prob=0.0)
            for u in batch
        ]


async def measure(settings: dict[str, Any], rooms: int, recording: bytes) -> dict[str, Any]:
    gap = bytes(BYTES_PER_SECOND)
    pcms = [clip(a).pcm16() + gap + clip(b).pcm16() + gap for a, b in ROOM_CLIPS[:rooms]]
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        fake = SleepyRecognizer(base=0.32, per_item=0.08)
        async with serve(Path(tmp), fake, **settings) as base:  # type: ignore[arg-type]
            ws = base.replace("http", "ws")
            for label, with_upload in (("alone", False), ("beside", True)):
                location = None
                if with_upload:
                    response = await upload(base, recording, "long.mp3")
                    location = response.headers["location"]
                    await asyncio.sleep(0.2)
                results = await asyncio.gather(
                    *(room(ws, f"{label}-{i}-{time.time_ns()}", p) for i, p in enumerate(pcms))
                )
                out[label] = [x for _, s in results for x in s]
                if location is not None:
                    job = (await get(base + location)).json()
                    out["progress"] = job["progress"]["fraction"]
    return out


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rooms", type=int, default=2)
    parser.add_argument(
        "--policies",
        nargs="+",
        default=["8,1", "4,1", "1,1", "1,0.5"],
        help="IN_FLIGHT_LIVE,LIVE_SHARE pairs",
    )
    args = parser.parse_args()
    long_form = clip(FILE_CLIP).samples()  # 137 s, four times: the file outlasts the rooms
    recording = audiofiles.encode(np.tile(long_form, 4), "wav")
    policies = [
        {"upload_in_flight_live": int(n), "upload_live_share": float(share)}
        for n, share in (p.split(",") for p in args.policies)
    ]
    for policy in policies:
        result = await measure(policy, args.rooms, recording)
        print(policy)
        print(f"  alone   server timing.total {summary(result['alone'])}")
        print(f"  beside  server timing.total {summary(result['beside'])}")
        print(f"  upload progress when the rooms ended: {result['progress']:.0%}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
