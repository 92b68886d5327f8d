"""One socket, N interleaved channels: N sources of the meeting, each served as a stream.

A multichannel stream (protocol v1 `channels=N`, Deepgram `multichannel=true`) is served
as N mono streams of the same meeting, one per channel, through the one session pipeline
(`serve`: server.sockets.stream.serve_source: admission, quotas, limits, the actor). The
`ChannelGroup` stands between them and the socket:

- the **pump** reads the socket once it is accepted: each binary frame is split
  (session/channels.py) into one frame per channel, each text frame (a control) goes to
  every channel, a disconnect or an error on the socket to every channel. Each channel
  has a bounded inbox: a channel that reads slowly holds the socket back (backpressure),
  one that has ended takes nothing more;
- each channel's messages go out on the socket tagged `"channel": c` (a compat codec
  translates them, e.g. Deepgram's `channel_index: [c, N]`);
- **one handshake:** the socket is accepted once every channel was admitted, or refused
  (with the first channel's refusal) if any was not;
- **one close:** when every channel is done, with the first error close code a channel
  closed with (else 1000). A channel that ends with an error ends the others too: they
  get `stop` (their utterance in progress is finalized, their finals are sent).

It keeps no state outside its own stream; nothing here is shared between connections.
`channel_query` and `channel_configs` read a stream's `channels` and participants.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson
from starlette.websockets import WebSocket, WebSocketDisconnect

from server.auth.keys import Principal, forbidden
from server.sockets.gate import Handshake
from session.channels import split_channels
from session.stream_state import Connection
from wire.codes import CloseCode, Encoding, ErrorCode
from wire.errors import ProtocolError
from wire.query import StreamConfig, channel_participants, parse_channels

logger = logging.getLogger(__name__)

# Frames a channel may have unread before the socket is read no further: a few, to smooth
# the channels' turns; the socket's own buffer holds the rest (backpressure).
INBOX_FRAMES = 8
STOP = {"type": "websocket.receive", "text": '{"type":"stop"}'}
INTERNAL = ProtocolError(
    ErrorCode.INTERNAL, CloseCode.INTERNAL_ERROR, "internal error; see server log"
)

Message = dict[str, Any]
Serve = Callable[[Handshake, StreamConfig, Connection], Awaitable[None]]


class ChannelGroup:
    """The channels of one socket: the pump, the inboxes, the handshake and the close."""

    def __init__(
        self,
        handshake: Handshake,
        socket: Connection,
        channels: int,
        encoding: Encoding,
        *,
        inbox_frames: int = INBOX_FRAMES,
    ) -> None:
        self._handshake = handshake
        self._socket = socket
        self._encoding = encoding
        self.channels = channels
        self._inboxes = [
            asyncio.Queue[Message | ProtocolError](inbox_frames) for _ in range(channels)
        ]
        self._done = [False] * channels  # the channel reads no more
        self._ready: set[int] = set()
        self._settled = asyncio.Event()  # the socket was accepted, or refused
        self._accepted = False
        self._close: tuple[int, str | None] | None = None  # the first error close
        self._gone = False  # the client went away
        self._sending = asyncio.Lock()

    @property
    def websocket(self) -> WebSocket:
        return self._handshake.websocket

    def connection(self, channel: int) -> ChannelConnection:
        return ChannelConnection(self, channel)

    def handshake(self, channel: int) -> ChannelHandshake:
        return ChannelHandshake(self, channel)

    # ------------------------------------------------------------------ handshake

    async def ready(self, channel: int) -> None:
        """Channel `channel` was admitted: accept the socket once all are, and wait till
        then. Raises WebSocketDisconnect if another channel was refused."""
        self._ready.add(channel)
        if len(self._ready) == self.channels and not self._settled.is_set():
            await self._handshake.accept()
            self._accepted = True
            self._settled.set()
        await self._settled.wait()
        if not self._accepted:
            raise WebSocketDisconnect(CloseCode.GOING_AWAY)

    async def refuse(self, error: ProtocolError) -> None:
        """A channel was refused before the socket was accepted: the whole stream is."""
        if not self._settled.is_set():
            self._settled.set()
            await self._handshake.refuse(error)

    # ------------------------------------------------------------------ client → channels

    async def pump(self) -> None:
        """Read the socket (once accepted) and feed every channel until the client leaves,
        the socket fails, or every channel is done."""
        await self._settled.wait()
        if not self._accepted:
            return
        try:
            while not all(self._done):
                message = await self._socket.receive()
                if message["type"] == "websocket.disconnect":
                    self._gone = True
                    await self._broadcast(message)
                    return
                data: bytes | None = message.get("bytes")
                if data is None:
                    await self._broadcast(message)
                    continue
                frames = split_channels(data, self.channels, self._encoding)
                for channel, frame in enumerate(frames):
                    await self._deliver(channel, {"type": "websocket.receive", "bytes": frame})
        except ProtocolError as exc:  # bad audio, a bad frame for the vendor's protocol
            await self._broadcast(exc)
        except (WebSocketDisconnect, RuntimeError, OSError):
            self._gone = True
            await self._broadcast({"type": "websocket.disconnect", "code": 1006})

    async def _broadcast(self, item: Message | ProtocolError) -> None:
        for channel in range(self.channels):
            await self._deliver(channel, item)

    async def _deliver(self, channel: int, item: Message | ProtocolError) -> None:
        if not self._done[channel]:
            await self._inboxes[channel].put(item)

    async def receive(self, channel: int) -> Message:
        item = await self._inboxes[channel].get()
        if isinstance(item, ProtocolError):
            raise item
        return item

    # ------------------------------------------------------------------ channels → client

    async def send(self, channel: int, data: str) -> None:
        message = orjson.loads(data)
        message["channel"] = channel
        async with self._sending:
            await self._socket.send_text(orjson.dumps(message).decode())

    async def closed(self, channel: int, code: int, reason: str | None) -> None:
        """Channel `channel` ended with a close: the socket closes once all have; an error
        close ends the other channels (`stop`)."""
        self.finished(channel)
        if code == CloseCode.NORMAL or self._close is not None:
            return
        self._close = (code, reason)
        for other in range(self.channels):
            if not self._done[other]:
                inbox = self._inboxes[other]
                while not inbox.empty():  # its unread audio: the stream is ending
                    inbox.get_nowait()
                inbox.put_nowait(STOP)

    def finished(self, channel: int) -> None:
        """Channel `channel` reads no more: drop what it had unread (a pump waiting for
        room in its inbox goes on)."""
        self._done[channel] = True
        inbox = self._inboxes[channel]
        while not inbox.empty():
            inbox.get_nowait()

    async def close(self) -> None:
        """Every channel is done: close the socket (unless the client left, or the stream
        was refused), with the first error code a channel closed with."""
        if self._gone or not self._accepted:
            return
        code, reason = self._close or (CloseCode.NORMAL, None)
        with contextlib.suppress(Exception):
            await self._socket.close(code, reason)


class ChannelConnection:
    """The socket as one channel's actor sees it (session.stream_state.Connection)."""

    def __init__(self, group: ChannelGroup, channel: int) -> None:
        self._group = group
        self.channel = channel

    async def receive(self) -> Message:
        return await self._group.receive(self.channel)

    async def send_text(self, data: str) -> None:
        await self._group.send(self.channel, data)

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        await self._group.closed(self.channel, code, reason)


class ChannelHandshake(Handshake):
    """One channel's share of the socket's handshake: it accepts once every channel is
    admitted, and a refusal refuses the whole socket."""

    def __init__(self, group: ChannelGroup, channel: int) -> None:
        super().__init__(group.websocket)
        self._group = group
        self._channel = channel

    async def accept(self) -> None:
        if not self.accepted:
            self.accepted = True
            await self._group.ready(self._channel)

    async def refuse(self, error: ProtocolError) -> None:
        await self._group.refuse(error)


async def serve_channels(
    handshake: Handshake,
    socket: Connection,
    configs: Sequence[StreamConfig],
    serve: Serve,
    *,
    inbox_frames: int = INBOX_FRAMES,
) -> None:
    """Serve one socket of interleaved audio as one stream per channel (`configs`, in
    channel order: each channel's participant), each through `serve`."""
    group = ChannelGroup(
        handshake, socket, len(configs), configs[0].encoding, inbox_frames=inbox_frames
    )

    async def channel(index: int, config: StreamConfig) -> None:
        try:
            await serve(group.handshake(index), config, group.connection(index))
        except WebSocketDisconnect:
            pass  # another channel was refused: so was the socket
        except Exception:
            logger.exception("channel %d of a multichannel stream failed", index)
            await group.refuse(INTERNAL)  # if it failed before the socket was accepted
        finally:
            group.finished(index)

    pump = asyncio.create_task(group.pump(), name="channels-pump")
    try:
        await asyncio.gather(*(channel(c, config) for c, config in enumerate(configs)))
    finally:
        pump.cancel()
        await asyncio.gather(pump, return_exceptions=True)
        await group.close()


def channel_query(query: dict[str, str], max_channels: int) -> tuple[dict[str, str], list[str]]:
    """A stream's `channels` and `participant`: (the query as one channel's config reads
    it, each channel's participant). ProtocolError (4400 bad_config) past `max_channels`,
    for participants that do not fit, or for a resume of a multichannel stream."""
    channels = parse_channels(query.get("channels"), max_channels)
    if channels == 1:
        return query, [query.get("participant", "speaker")]
    if "resume_token" in query:
        raise ProtocolError(
            ErrorCode.BAD_CONFIG,
            CloseCode.BAD_REQUEST,
            "a multichannel stream cannot be resumed as one: resume each channel's source "
            "as a mono stream with its own resume_token",
        )
    participants = channel_participants(query.get("participant", "speaker"), channels)
    return {**query, "participant": participants[0]}, list(participants)


def channel_configs(
    config: StreamConfig, participants: Sequence[str], bound: str | None
) -> list[StreamConfig]:
    """One config per channel, each its own participant. A meeting token bound to one
    participant (`bound`) streams one channel only (4403)."""
    if bound is not None:
        raise forbidden(f"the meeting token is for participant {bound!r}: one channel only")
    return [dataclasses.replace(config, participant=name) for name in participants]


def bind_participant(
    config: StreamConfig, principal: Principal, query: dict[str, str]
) -> StreamConfig:
    """A meeting token bound to a participant streams as that participant only."""
    bound = principal.participant
    if bound is None:
        return config
    if "participant" in query and query["participant"] != bound:
        raise forbidden(f"the meeting token is for participant {bound!r}")
    return dataclasses.replace(config, participant=bound)
