"""A small protocol v1 client for the end-to-end tests."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

BYTES_PER_SECOND = 32_000  # 16 kHz pcm_s16le


@dataclass
class StreamResult:
    messages: list[dict[str, Any]] = field(default_factory=list)
    close_code: int | None = None
    close_reason: str = ""

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["type"] == kind]

    @property
    def finals(self) -> list[dict[str, Any]]:
        return self.of_type("transcript.final")

    @property
    def text(self) -> str:
        return " ".join(m["text"] for m in self.finals)


def stream_url(base: str, meeting: str, **params: Any) -> str:
    query = urlencode({k: str(v).lower() if isinstance(v, bool) else v for k, v in params.items()})
    return f"{base}/v1/meetings/{meeting}/stream" + (f"?{query}" if query else "")


async def receive_all(ws: ClientConnection, result: StreamResult) -> None:
    try:
        async for raw in ws:
            result.messages.append(orjson.loads(raw))
    except ConnectionClosed:
        pass
    result.close_code = ws.close_code
    result.close_reason = ws.close_reason or ""


async def stream_pcm(
    base: str,
    meeting: str,
    pcm: bytes,
    *,
    participant: str = "speaker",
    speed: float = 1.0,
    frame_ms: int = 20,
    trailing_silence: float = 0.0,
    **params: Any,
) -> StreamResult:
    """Stream 16 kHz s16 audio paced at `speed` × real time, then `stop`; collect replies."""
    result = StreamResult()
    pcm = pcm + bytes(int(trailing_silence * BYTES_PER_SECOND) // 2 * 2)
    url = stream_url(base, meeting, participant=participant, **params)
    async with connect(url, max_size=None) as ws:
        receiver = asyncio.create_task(receive_all(ws, result))
        frame = BYTES_PER_SECOND * frame_ms // 1000
        started = time.monotonic()
        for i, offset in enumerate(range(0, len(pcm), frame)):
            await ws.send(pcm[offset : offset + frame])
            if speed > 0:
                delay = started + (i + 1) * frame_ms / 1000 / speed - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
        await ws.send(orjson.dumps({"type": "stop"}).decode())
        await asyncio.wait_for(receiver, 120)
    return result
