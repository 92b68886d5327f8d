"""What every compat adapter shares: the translating connection the session actor reads
and writes through, the handshake that refuses in the vendor's terms, and the mapping of
the vendor's credentials onto Parley's API keys and meeting tokens.

An adapter is a `Codec`: sans-I/O, it turns each client frame into protocol v1 frames
for the actor (audio bytes, `finalize`/`stop`/`keepalive` controls) plus any replies the
vendor's protocol owes at once, and each protocol v1 server message into the vendor's
messages. Everything else (VAD, the model, the store, listeners, limits, auth, metrics)
is the one session pipeline behind `server.sockets.stream.serve_source`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from starlette.responses import Response
from starlette.websockets import WebSocket, WebSocketDisconnect

from server.auth.keys import ANONYMOUS, Authenticator, Principal, Scope, unauthorized
from server.logs import note_denial
from server.sockets.gate import Handshake, close_reason
from wire.codes import CloseCode, ErrorCode
from wire.errors import ProtocolError

Message = dict[str, Any]  # an ASGI websocket message


@dataclass(slots=True)
class Inbound:
    """What one client frame becomes: frames for the actor, replies for the client."""

    to_actor: list[Message] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)


def audio(data: bytes) -> Message:
    return {"type": "websocket.receive", "bytes": data}


def control(kind: str) -> Message:
    """A protocol v1 control message (`finalize`, `stop`, `keepalive`) for the actor."""
    return {"type": "websocket.receive", "text": orjson.dumps({"type": kind}).decode()}


class Codec(Protocol):
    def from_client(self, message: Message) -> Inbound: ...
    def from_server(self, message: Message) -> list[str]: ...


class TranslatingConnection:
    """The socket as the session actor sees it: vendor frames in, protocol v1 out, and
    back. Text frames are held to the audio frame limit (with room for base64), so a
    vendor's JSON cannot be bigger than the audio it may carry."""

    def __init__(self, websocket: WebSocket, codec: Codec, *, max_frame_bytes: int) -> None:
        self._websocket = websocket
        self.codec = codec
        self._max_text = max_frame_bytes * 4 // 3 + 4096
        self._pending: deque[Message] = deque()
        self._sending = asyncio.Lock()

    async def receive(self) -> Message:
        while not self._pending:
            message = dict(await self._websocket.receive())
            if message["type"] == "websocket.disconnect":
                return message
            text = message.get("text")
            if text is not None and len(text) > self._max_text:
                raise ProtocolError(
                    ErrorCode.FRAME_TOO_LARGE,
                    CloseCode.MESSAGE_TOO_BIG,
                    f"text frame of {len(text)} characters exceeds the limit of {self._max_text}",
                )
            inbound = self.codec.from_client(message)
            try:
                for reply in inbound.replies:
                    await self._send(reply)
            except (WebSocketDisconnect, RuntimeError, OSError):
                # The client left while its reply was on the way: its disconnect, as a
                # `receive` would have said a moment later (not a server fault).
                return {"type": "websocket.disconnect", "code": 1006}
            self._pending.extend(inbound.to_actor)
        return self._pending.popleft()

    async def prime(self) -> bool:
        """Serve the client until its first frame for the actor (kept for the actor's
        first `receive`): for protocols configured by messages before the audio. False if
        the client left first."""
        message = await self.receive()
        if message["type"] == "websocket.disconnect":
            return False
        self._pending.appendleft(message)
        return True

    async def send_text(self, data: str) -> None:
        for text in self.codec.from_server(orjson.loads(data)):
            await self._send(text)

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        await self._websocket.close(code, reason)

    async def _send(self, text: str) -> None:
        async with self._sending:  # the reader's replies and the writer's messages
            await self._websocket.send_text(text)


def http_status(error: ProtocolError) -> int:
    """The HTTP status of a refusal before the upgrade (4xxx close codes are 4000 + it)."""
    code = int(error.close_code)
    if 4400 <= code < 4600:
        return code - 4000
    return {CloseCode.TRY_AGAIN_LATER: 503, CloseCode.INTERNAL_ERROR: 500}.get(
        error.close_code, 400
    )


class CompatHandshake(Handshake):
    """Accepts with the vendor's headers and subprotocol. A refusal before the upgrade is
    an HTTP response in the vendor's error format (what its SDK reports); after it, the
    vendor's error message and the named close code."""

    def __init__(
        self,
        websocket: WebSocket,
        *,
        denial: Callable[[ProtocolError], Response],
        farewell: Callable[[ProtocolError], str],
        headers: Mapping[str, str] | None = None,
        subprotocol: str | None = None,
    ) -> None:
        super().__init__(websocket)
        self.subprotocol = subprotocol
        self._denial = denial
        self._farewell = farewell
        self._headers = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]

    async def accept(self) -> None:
        if not self.accepted:
            self.accepted = True
            await self.websocket.accept(subprotocol=self.subprotocol, headers=self._headers)

    async def refuse(self, error: ProtocolError) -> None:
        with contextlib.suppress(RuntimeError, WebSocketDisconnect, OSError):
            if not self.accepted:
                self.accepted = True
                note_denial()
                await self.websocket.send_denial_response(self._denial(error))
                return
            await self.websocket.send_text(self._farewell(error))
            await self.websocket.close(error.close_code, close_reason(error.message))


def subprotocol_credential(
    offered: Iterable[str], schemes: Iterable[str]
) -> tuple[str, str] | None:
    """(the subprotocol to select, the credential) when a browser passes it as a pair of
    subprotocols, `["token", CREDENTIAL]` (Deepgram's way), else None."""
    values = list(offered)
    for scheme in schemes:
        if scheme in values and values.index(scheme) + 1 < len(values):
            return scheme, values[values.index(scheme) + 1]
    return None


async def compat_principal(
    handshake: Handshake,
    auth: Authenticator,
    meeting_id: str,
    *,
    schemes: Iterable[str],
    subprotocol_token: str | None = None,
) -> Principal:
    """The principal of a compat socket: its Origin checked, then `Authorization: <scheme>
    <credential>` with one of the vendor's `schemes` (an API key or a meeting token), else
    a meeting token from a subprotocol or the `access_token` query parameter (never an API
    key: those stay out of URLs and subprotocols). Raises ProtocolError 4401/4403 (4403
    `protected_mode` first, for a client that protected mode keeps out)."""
    websocket = handshake.websocket
    auth.admit(websocket)
    if not auth.enabled:
        return ANONYMOUS
    allowed = [s.lower() for s in schemes]
    wanted = " or ".join(f"{s.capitalize()} <credential>" for s in allowed)
    header = websocket.headers.get("authorization")
    if header is not None:
        scheme, _, credential = header.strip().partition(" ")
        if scheme.lower() not in allowed or not credential.strip():
            raise unauthorized(f"the Authorization header must be: {wanted}")
        return await auth.resolve(credential.strip(), meeting_id, Scope.STREAM, keys_allowed=True)
    token = subprotocol_token or websocket.query_params.get("access_token")
    if token is not None:
        return await auth.resolve(token, meeting_id, Scope.STREAM, keys_allowed=False)
    raise unauthorized(f"authentication required: Authorization: {wanted}")
