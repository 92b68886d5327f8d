"""One stereo socket against two mono sockets: final latency and WER per channel.

JFK and a LibriSpeech clip, paced at real time, to a running server (`python -m server`):
as two mono protocol v1 streams of one meeting, then as one `channels=2` stream carrying
both interleaved. A final's latency is its arrival minus the wall time its `end` was sent
(docs/protocol.md). Usage: python -m bench.multichannel --url ws://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import Any

import numpy as np
import orjson
from websockets.asyncio.client import connect

from bench.corpus import clips as corpus_clips
from loadgen.wer import error_rate

FRAME_S = 0.02
CLIPS = ("en_jfk", "en_ls_2412-153948-0000")


async def paced_stream(url: str, pcm: bytes, frame_bytes: int) -> tuple[list[Any], float]:
    """Send `pcm` at real time in FRAME_S frames, then stop; the messages and the start."""
    messages: list[Any] = []
    async with connect(url, max_size=None) as ws:

        async def read() -> None:
            async for raw in ws:
                message = orjson.loads(raw)
                message["_at"] = time.monotonic()
                messages.append(message)

        reader = asyncio.create_task(read())
        started = time.monotonic()
        for i, offset in enumerate(range(0, len(pcm), frame_bytes)):
            await ws.send(pcm[offset : offset + frame_bytes])
            await asyncio.sleep(max(0.0, started + (i + 1) * FRAME_S - time.monotonic()))
        await ws.send('{"type": "stop"}')
        await reader
    return messages, started


def report(label: str, finals: list[Any], started: float, reference: str) -> None:
    latencies = [m["_at"] - (started + m["end"]) for m in finals]
    text = " ".join(m["text"] for m in finals)
    print(
        f"{label:<34} finals {len(finals):2d}  latency median {statistics.median(latencies):.2f} s"
        f"  max {max(latencies):.2f} s  WER {error_rate(reference, text):.3f}"
    )


async def main(base: str) -> None:
    clips = [next(c for c in corpus_clips([name]) if c.id == name) for name in CLIPS]
    tracks = [np.round(c.audio() * 32768).clip(-32768, 32767).astype("<i2") for c in clips]
    length = max(len(t) for t in tracks)
    padded = [np.pad(t, (0, length - len(t))) for t in tracks]
    mono_frame = int(16_000 * FRAME_S) * 2
    meeting = f"bench-mc-{uuid.uuid4().hex[:8]}"
    url = f"{base}/v1/meetings/{meeting}/stream?interim_results=true&participant="
    both = await asyncio.gather(
        *(paced_stream(url + f"mono{c}", t.tobytes(), mono_frame) for c, t in enumerate(padded))
    )
    for c, (messages, started) in enumerate(both):
        finals = [m for m in messages if m["type"] == "transcript.final"]
        report(f"two mono sockets, channel {c}", finals, started, clips[c].reference)
    stereo = np.stack(padded, axis=1).tobytes()
    messages, started = await paced_stream(
        f"{base}/v1/meetings/{meeting}-st/stream?interim_results=true&channels=2",
        stereo,
        mono_frame * 2,
    )
    for c in (0, 1):
        finals = [m for m in messages if m["type"] == "transcript.final" and m["channel"] == c]
        report(f"one stereo socket, channel {c}", finals, started, clips[c].reference)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="ws://127.0.0.1:8000")
    asyncio.run(main(parser.parse_args().url))
