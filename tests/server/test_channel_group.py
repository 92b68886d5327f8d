"""server/sockets/channels.py's fan-out with a scripted socket and scripted channels: the
bounded inboxes hold the socket back, a refusal refuses the socket once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from server.sockets.channels import serve_channels
from server.sockets.gate import Handshake
from session.stream_state import Connection
from wire.codes import CloseCode, Encoding, ErrorCode
from wire.errors import ProtocolError
from wire.query import StreamConfig

FRAMES = 40
STEREO_FRAME = bytes(640)  # 160 stereo s16 samples


class ScriptedSocket:
    """Gives FRAMES audio frames, then a disconnect; counts what was read."""

    def __init__(self) -> None:
        self.reads = 0
        self.sent: list[str] = []
        self.closed: tuple[int, str | None] | None = None

    async def receive(self) -> dict[str, Any]:
        self.reads += 1
        if self.reads > FRAMES:
            return {"type": "websocket.disconnect", "code": 1000}
        return {"type": "websocket.receive", "bytes": STEREO_FRAME}

    async def send_text(self, data: str) -> None:
        self.sent.append(data)

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        self.closed = (code, reason)


class ScriptedHandshake(Handshake):
    def __init__(self) -> None:
        self.websocket: Any = type("Ws", (), {"scope": {}})()
        super().__init__(self.websocket)
        self.refusals: list[ProtocolError] = []

    async def accept(self) -> None:
        self.accepted = True

    async def refuse(self, error: ProtocolError) -> None:
        self.refusals.append(error)


def configs() -> list[StreamConfig]:
    return [
        StreamConfig("m", name, "en", 16_000, Encoding.PCM_S16LE, interim_results=False)
        for name in ("a", "b")
    ]


async def test_a_channel_that_reads_nothing_holds_the_socket_back() -> None:
    """While one channel reads nothing, the socket is read no further than its inbox
    holds; once it reads, every frame reaches both channels, split in two, and the
    client's disconnect reaches both."""
    socket, release = ScriptedSocket(), asyncio.Event()
    received: dict[str, list[int]] = {"a": [], "b": []}

    async def serve(shake: Handshake, config: StreamConfig, channel: Connection) -> None:
        await shake.accept()
        if config.participant == "b":
            await release.wait()
        while (message := await channel.receive())["type"] != "websocket.disconnect":
            received[config.participant].append(len(message["bytes"]))

    serving = asyncio.create_task(serve_channels(ScriptedHandshake(), socket, configs(), serve))
    for _ in range(50):  # let the pump and channel a run as far as they can
        await asyncio.sleep(0)
    assert 8 <= socket.reads <= 8 + 2, socket.reads  # INBOX_FRAMES, one in hand, one waiting
    release.set()
    await asyncio.wait_for(serving, 5)
    assert received == {"a": [320] * FRAMES, "b": [320] * FRAMES}
    assert socket.closed is None  # the client left: nothing to close


async def test_one_refused_channel_refuses_the_socket_once() -> None:
    """Channel b is refused before the socket is accepted: the socket is refused with its
    error, channel a (waiting to be accepted) goes no further, nothing is read."""
    socket, handshake = ScriptedSocket(), ScriptedHandshake()
    full = ProtocolError(ErrorCode.OVERLOADED, CloseCode.TRY_AGAIN_LATER, "full")
    served: list[str] = []

    async def serve(shake: Handshake, config: StreamConfig, channel: Connection) -> None:
        if config.participant == "b":
            await shake.refuse(full)
            return
        await shake.accept()
        served.append(config.participant)

    await asyncio.wait_for(serve_channels(handshake, socket, configs(), serve), 5)
    assert handshake.refusals == [full] and not handshake.accepted
    assert served == [] and socket.reads == 0 and socket.closed is None


@pytest.mark.parametrize("frame", [bytes(2), bytes(642)])
async def test_a_torn_stereo_frame_reaches_every_channel_as_1007(frame: bytes) -> None:
    """A frame that is not whole stereo samples: every channel's receive raises 1007."""
    errors: list[int] = []

    class Torn(ScriptedSocket):
        async def receive(self) -> dict[str, Any]:
            return {"type": "websocket.receive", "bytes": frame}

    async def serve(shake: Handshake, config: StreamConfig, channel: Connection) -> None:
        await shake.accept()
        with pytest.raises(ProtocolError) as raised:
            await channel.receive()
        errors.append(raised.value.close_code)

    await asyncio.wait_for(serve_channels(ScriptedHandshake(), Torn(), configs(), serve), 5)
    assert errors == [CloseCode.INVALID_PAYLOAD] * 2
