"""A small protocol v1 client for the end-to-end tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
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
    arrived: asyncio.Event = field(default_factory=asyncio.Event)  # set on every message
    arrival_times: list[float] = field(default_factory=list)  # time.monotonic() per message
    started: float = 0.0  # time.monotonic() when stream_pcm sent its first frame
    speed: float = 1.0  # stream_pcm's pace, × real time

    async def wait_for(self, predicate: Callable[[StreamResult], bool]) -> None:
        """Wait until `predicate(self)` holds; re-checked as each message arrives."""
        while not predicate(self):
            self.arrived.clear()
            await self.arrived.wait()

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["type"] == kind]

    @property
    def finals(self) -> list[dict[str, Any]]:
        return self.of_type("transcript.final")

    @property
    def text(self) -> str:
        return " ".join(m["text"] for m in self.finals)

    @property
    def final_latencies(self) -> list[float]:
        """Seconds from when each final's audio `end` was sent to the final's arrival, as
        the client sees it (for a paced stream_pcm)."""
        return [
            arrived - (self.started + message["end"] / self.speed)
            for arrived, message in zip(self.arrival_times, self.messages, strict=True)
            if message["type"] == "transcript.final"
        ]


def stream_url(base: str, meeting: str, **params: Any) -> str:
    query = urlencode({k: str(v).lower() if isinstance(v, bool) else v for k, v in params.items()})
    return f"{base}/v1/meetings/{meeting}/stream" + (f"?{query}" if query else "")


async def receive_all(ws: ClientConnection, result: StreamResult) -> None:
    try:
        async for raw in ws:
            result.messages.append(orjson.loads(raw))
            result.arrival_times.append(time.monotonic())
            result.arrived.set()
    except ConnectionClosed:
        pass
    finally:
        result.arrived.set()
    result.close_code = ws.close_code
    result.close_reason = ws.close_reason or ""


async def stream_pcm(
    base: str,
    meeting: str,
    pcm: bytes,
    *,
    participant: str | None = "speaker",
    speed: float = 1.0,
    frame_ms: int = 20,
    trailing_silence: float = 0.0,
    drain_timeout: float = 120.0,
    headers: dict[str, str] | None = None,
    **params: Any,
) -> StreamResult:
    """Stream 16 kHz s16 audio paced at `speed` × real time, then `stop`; collect replies
    (for up to `drain_timeout` seconds after `stop`). `headers` go with the upgrade."""
    result = StreamResult(speed=speed)
    pcm = pcm + bytes(int(trailing_silence * BYTES_PER_SECOND) // 2 * 2)
    if participant is not None:
        params["participant"] = participant
    url = stream_url(base, meeting, **params)
    async with connect(url, max_size=None, additional_headers=headers) as ws:
        receiver = asyncio.create_task(receive_all(ws, result))
        frame = BYTES_PER_SECOND * frame_ms // 1000
        started = result.started = time.monotonic()
        for i, offset in enumerate(range(0, len(pcm), frame)):
            await ws.send(pcm[offset : offset + frame])
            if speed > 0:
                delay = started + (i + 1) * frame_ms / 1000 / speed - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
        await ws.send(orjson.dumps({"type": "stop"}).decode())
        await asyncio.wait_for(receiver, drain_timeout)
    return result


@dataclass
class ResumableStream:
    """A client that keeps all the audio it sent (its ring buffer is the whole clip), so it
    can drop the connection at any point, resume with its token, and re-send from
    `resume_from`. Collects every message of every connection."""

    base: str
    meeting: str
    pcm: bytes
    participant: str = "speaker"
    speed: float = 4.0
    headers: dict[str, str] | None = None  # e.g. an API key's Authorization
    connections: list[StreamResult] = field(default_factory=list)
    resume_times: list[float] = field(default_factory=list)
    connected: asyncio.Event = field(default_factory=asyncio.Event)  # a connection opened

    @property
    def finals(self) -> list[dict[str, Any]]:
        return [f for c in self.connections for f in c.finals]

    @property
    def last_seq(self) -> int:
        return max((f["seq"] for f in self.finals), default=0)

    @property
    def token(self) -> str:
        token: str = self.connections[0].messages[0]["resume_token"]
        return token

    async def run(self, drop_at: list[int] | None = None, *, resume: bool = False) -> None:
        """Stream to `base`; abort the connection once `drop_at[i]` bytes have been sent and
        resume. With `resume=True`, start by resuming this stream's earlier session (e.g.
        after its server died, on another server). A connection the server closes raises."""
        drops = sorted(drop_at or [])
        resuming = resume
        while True:
            result = StreamResult()
            self.connections.append(result)
            self.connected.set()
            params: dict[str, Any] = {"participant": self.participant}
            if resuming:
                params = {"resume_token": self.token, "last_seq": self.last_seq}
            asked = time.monotonic()
            receiver: asyncio.Task[None] | None = None
            try:
                async with connect(
                    stream_url(self.base, self.meeting, **params),
                    max_size=None,
                    additional_headers=self.headers,
                ) as ws:
                    receiver = asyncio.create_task(receive_all(ws, result))
                    await result.wait_for(lambda r: bool(r.messages) or r.close_code is not None)
                    started = result.messages[0]
                    assert started["type"] == "session.started", started
                    if resuming:
                        self.resume_times.append(time.monotonic() - asked)
                    offset = round(started["resume_from"] * 16_000) * 2
                    drop = next((d for d in drops if d > offset), None)
                    await self._send(ws, offset, len(self.pcm) if drop is None else drop)
                    if drop is None:
                        await ws.send(orjson.dumps({"type": "stop"}).decode())
                        await asyncio.wait_for(receiver, 120)
                        return
                    drops.remove(drop)
                    ws.transport.abort()  # a dropped connection, not a close handshake
                    await asyncio.wait_for(receiver, 10)
                    resuming = True
            finally:
                # A send that finds the connection gone (a killed server) raises before the
                # receiver has seen the end: let it record how it closed (`close_code`).
                if receiver is not None:
                    await asyncio.wait_for(receiver, 10)

    async def _send(self, ws: ClientConnection, start: int, end: int) -> None:
        frame = BYTES_PER_SECOND // 50
        began = time.monotonic()
        for i, offset in enumerate(range(start, end, frame)):
            await ws.send(self.pcm[offset : min(offset + frame, end)])
            delay = began + (i + 1) * 0.02 / self.speed - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
