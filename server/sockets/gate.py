"""What a WebSocket passes before it is served: its Origin, its credentials, and, when
refused, an `error` message and a named close code it can read.

Refusals accept first, so that every client (a browser included, which sees nothing of an
HTTP status at upgrade) reads the `error` and the close code. When the client offered
subprotocols, the server selects `parley.v1`: browsers fail a handshake in which the
server selects none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from starlette.websockets import WebSocket, WebSocketDisconnect

from server.auth.access import client_host
from server.auth.keys import (
    SUBPROTOCOL,
    TOKEN_SUBPROTOCOL,
    Authenticator,
    Principal,
    Scope,
    forbidden,
    unauthorized,
)
from server.limits import ALL, Slots, overloaded
from server.state import AppState
from wire.build import encode
from wire.codes import CloseCode, ErrorCode
from wire.control import parse_auth
from wire.errors import ProtocolError

logger = logging.getLogger(__name__)

MAX_CLOSE_REASON = 123  # bytes of UTF-8 a close frame's reason may hold (RFC 6455 5.5)


def close_reason(message: str) -> str:
    """`message` cut to fit a close frame: at most 123 bytes of UTF-8, whole characters."""
    encoded = message.encode()
    if len(encoded) <= MAX_CLOSE_REASON:
        return message
    return encoded[: MAX_CLOSE_REASON - 3].decode(errors="ignore") + "..."


class Handshake:
    """One socket's accept: at most once, with the subprotocol the client can take."""

    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket
        offered = [str(p) for p in websocket.scope.get("subprotocols") or []]
        self.offered = offered
        self.subprotocol = SUBPROTOCOL if SUBPROTOCOL in offered else None
        self.accepted = False

    async def accept(self) -> None:
        if not self.accepted:
            self.accepted = True
            await self.websocket.accept(subprotocol=self.subprotocol)

    async def refuse(self, error: ProtocolError) -> None:
        """Say why in an `error` message, then close with the named code."""
        with contextlib.suppress(RuntimeError, WebSocketDisconnect, OSError):
            await self.accept()
            await self.websocket.send_text(encode(error.to_message()))
            await self.websocket.close(error.close_code, close_reason(error.message))

    def token_subprotocol(self) -> str | None:
        for value in self.offered:
            if value.startswith(TOKEN_SUBPROTOCOL):
                return value[len(TOKEN_SUBPROTOCOL) :]
        return None


async def authenticate(
    handshake: Handshake,
    auth: Authenticator,
    meeting_id: str,
    scope: Scope,
    *,
    timeout_s: float,
    waiting: Slots,
) -> Principal:
    """Check protected mode (server/auth/access.py) and the Origin, then find and resolve the
    socket's credentials: the Authorization header (API key or meeting token), the token
    subprotocol or the `access_token` query parameter (meeting tokens only), or else an
    `auth` message, which must come first and within `timeout_s` (while `waiting` has
    room: the sockets waiting so are bounded). Raises ProtocolError (4401, 4403, 1013) or
    WebSocketDisconnect."""
    websocket = handshake.websocket
    auth.admit(client_host(websocket))
    if not auth.origins.allows(websocket.headers.get("origin"), websocket.headers.get("host")):
        raise forbidden("this page's Origin may not open Parley sockets (PARLEY_ALLOWED_ORIGINS)")
    principal = await auth.presented(
        websocket.headers.get("authorization"),
        handshake.token_subprotocol() or websocket.query_params.get("access_token"),
        meeting_id,
        scope,
    )
    if principal is not None:
        return principal
    await handshake.accept()
    if not waiting.acquire(ALL):
        raise overloaded(f"{waiting.limit} sockets are waiting to authenticate; retry later")
    try:
        credential = await _auth_message(websocket, timeout_s)
    finally:
        waiting.release(ALL)
    return await auth.resolve(credential, meeting_id, scope, keys_allowed=True)


async def _auth_message(websocket: WebSocket, timeout_s: float) -> str:
    """The token of the socket's first message, `{"type": "auth", "token": "..."}`."""
    try:
        async with asyncio.timeout(timeout_s):
            message = await websocket.receive()
    except TimeoutError:
        raise unauthorized(f"not authenticated within {timeout_s:g} s") from None
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000))
    token = parse_auth(message.get("text"))
    if token is None:
        raise unauthorized(
            'authenticate first: Authorization header, access_token, or {"type": "auth", '
            '"token": ...} as the first message'
        )
    return token


async def authenticate_socket(
    state: AppState, handshake: Handshake, meeting_id: str, scope: Scope
) -> Principal:
    """The socket's principal (`authenticate`), under the app's auth settings."""
    return await authenticate(
        handshake,
        state.auth,
        meeting_id,
        scope,
        timeout_s=state.settings.auth.auth_timeout_s,
        waiting=state.waiting_auth,
    )


async def refuse(state: AppState, handshake: Handshake, error: ProtocolError) -> None:
    state.metrics.refused.labels(str(int(error.close_code))).inc()
    await handshake.refuse(error)


def non_negative(name: str, raw: str) -> int:
    """A query parameter that counts (`after_seq`, `last_seq`); 4400 `bad_config` if not."""
    if not raw.isdigit() or len(raw) > 18:
        raise ProtocolError(
            ErrorCode.BAD_CONFIG, CloseCode.BAD_REQUEST, f"{name} must be a non-negative integer"
        )
    return int(raw)
