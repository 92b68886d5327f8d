"""A tiny protocol v1 server for the load generator's client tests.

It "recognises" by energy: any non-zero 10 ms block is speech, 0.3 s of digital silence
ends an utterance. That matches how the load generator lays out corpus clips (exact
zeros between them), so every clip yields one final spanning it. Behaviours the real
server does not produce on demand (duplicate finals, a close mid-stream, no
`session.ended`, an HTTP refusal) are switched on per meeting through `StubBehaviour`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

import numpy as np
import orjson
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from wire.codes import DEFAULT_SAMPLE_RATE, CloseCode

BLOCK = DEFAULT_SAMPLE_RATE // 100  # 10 ms
END_SILENCE = round(0.3 * DEFAULT_SAMPLE_RATE)
PARTIAL_EVERY = round(0.5 * DEFAULT_SAMPLE_RATE)


@dataclass(frozen=True, slots=True)
class StubBehaviour:
    text: str = "stub words"
    duplicate_finals: bool = False
    close_after_s: float | None = None  # close with `close_code` after this much audio
    close_code: int = CloseCode.TRY_AGAIN_LATER
    no_session_ended: bool = False  # after `stop`, say nothing and keep the socket open
    http_status: int | None = None  # refuse the handshake with this status


@dataclass
class StubServer:
    behaviour_for: Callable[[str], StubBehaviour]
    server: Server | None = None
    seq: dict[str, int] = field(default_factory=dict)
    controls: list[tuple[str, str]] = field(default_factory=list)  # (meeting, type) received

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = next(iter(self.server.sockets)).getsockname()[:2]
        return f"ws://{host}:{port}"

    def process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        status = self.behaviour_for(_meeting(request.path)).http_status
        if status is None:
            return None
        return Response(status, "Refused", Headers(), b"refused by the stub\n")

    async def handler(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        meeting = _meeting(ws.request.path)
        query = {k: v[0] for k, v in parse_qs(urlsplit(ws.request.path).query).items()}
        participant = query.get("participant", "speaker")
        behaviour = self.behaviour_for(meeting)
        stream = _Stream(self, meeting, participant, behaviour)
        await ws.send(
            stream.json(
                type="session.started",
                protocol=1,
                session_id="s",
                meeting_id=meeting,
                participant=participant,
                config=query,
                resume_token="t",
                resume_from=0.0,
                last_seq=0,
            )
        )
        with contextlib.suppress(ConnectionClosed):
            async for message in ws:
                if isinstance(message, bytes):
                    for reply in stream.audio(np.frombuffer(message, dtype="<i2")):
                        await ws.send(reply)
                    limit = behaviour.close_after_s
                    if limit is not None and stream.offset >= limit * DEFAULT_SAMPLE_RATE:
                        await ws.close(behaviour.close_code, "stub closes")
                        return
                    continue
                kind = orjson.loads(message)["type"]
                self.controls.append((meeting, kind))
                if kind in ("finalize", "stop"):
                    for reply in stream.flush():
                        await ws.send(reply)
                if kind == "stop" and not behaviour.no_session_ended:
                    await ws.send(
                        stream.json(
                            type="session.ended",
                            reason="stop",
                            audio_seconds=stream.offset / DEFAULT_SAMPLE_RATE,
                            utterances=stream.count,
                            finals=stream.count,
                        )
                    )
                    await ws.close(CloseCode.NORMAL)
                    return


class _Stream:
    def __init__(self, stub: StubServer, meeting: str, participant: str, b: StubBehaviour) -> None:
        self.stub, self.meeting, self.participant, self.behaviour = stub, meeting, participant, b
        self.offset = 0
        self.start: int | None = None
        self.voice_end = 0
        self.partial_at = 0
        self.count = 0

    def json(self, **message: object) -> str:
        return orjson.dumps(message).decode()

    def audio(self, samples: np.ndarray) -> list[str]:
        replies = []
        for i in range(0, len(samples), BLOCK):
            block = samples[i : i + BLOCK]
            end = self.offset + len(block)
            if np.any(block):
                if self.start is None:
                    self.start, self.partial_at = self.offset, self.offset + PARTIAL_EVERY
                self.voice_end = end
                if end >= self.partial_at:
                    self.partial_at = end + PARTIAL_EVERY
                    replies.append(self._transcript("transcript.partial", end))
            elif self.start is not None and end - self.voice_end >= END_SILENCE:
                replies += self.flush()
            self.offset = end
        return replies

    def flush(self) -> list[str]:
        if self.start is None:
            return []
        self.stub.seq[self.meeting] = self.stub.seq.get(self.meeting, 0) + 1
        final = self._transcript("transcript.final", self.voice_end)
        self.start = None
        self.count += 1
        return [final, final] if self.behaviour.duplicate_finals else [final]

    def _transcript(self, kind: str, end: int) -> str:
        assert self.start is not None
        message: dict[str, object] = {
            "type": kind,
            "utterance_id": f"{self.participant}-{self.start}",
            "participant": self.participant,
            "text": self.behaviour.text,
            "start": self.start / DEFAULT_SAMPLE_RATE,
            "end": end / DEFAULT_SAMPLE_RATE,
        }
        if kind == "transcript.final":
            message.update(seq=self.stub.seq[self.meeting], language="en")
        return self.json(**message)


def _meeting(path: str) -> str:
    parts = urlsplit(path).path.split("/")
    return parts[3] if len(parts) > 3 else ""


@contextlib.asynccontextmanager
async def stub_server(
    behaviour_for: Callable[[str], StubBehaviour] = lambda meeting: StubBehaviour(),
) -> AsyncIterator[StubServer]:
    """A running stub on a free loopback port."""
    stub = StubServer(behaviour_for)
    async with serve(
        stub.handler, "127.0.0.1", 0, process_request=stub.process_request, compression=None
    ) as server:
        stub.server = server
        yield stub
