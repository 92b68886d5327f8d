"""The WebSocket endpoint of a meeting's listeners: the meeting's finals so far, then
every `transcript.*` event of every source as it happens."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import orjson
from starlette.websockets import WebSocket, WebSocketDisconnect

from server.auth.keys import Scope
from server.auth.ownership import OwnerCheck
from server.cancel import cancel_and_wait
from server.sockets.gate import (
    Handshake,
    authenticate_socket,
    close_reason,
    non_negative,
    refuse,
)
from server.state import AppState, app_state
from store.errors import SubscriberLagged
from wire.build import encode, transcript_final
from wire.codes import CloseCode, ErrorCode
from wire.errors import ProtocolError
from wire.query import validate_id
from wire.timeline import in_meeting_order

logger = logging.getLogger(__name__)


async def events_endpoint(websocket: WebSocket) -> None:
    """Listener feed: the meeting's finals so far (after `after_seq`), then every
    `transcript.*` event of every source as it happens."""
    state = app_state(websocket)
    handshake = Handshake(websocket)
    meeting_id = websocket.path_params["meeting_id"]
    try:
        principal = await authenticate_socket(state, handshake, meeting_id, Scope.EVENTS)
        validate_id("meeting_id", meeting_id)
        after_seq = non_negative("after_seq", websocket.query_params.get("after_seq", "0"))
        owner = OwnerCheck(state.store, meeting_id, principal)
        await owner.start()
    except WebSocketDisconnect:
        return
    except ProtocolError as exc:
        await refuse(state, handshake, exc)
        return
    try:
        lease = await state.listener_slots.acquire(meeting_id, principal.tenant)
    except ProtocolError as exc:
        await refuse(state, handshake, exc)
        return
    state.metrics.listeners.inc()
    try:
        await handshake.accept()
        error = await _serve_listener(websocket, state, meeting_id, after_seq, owner)
    finally:
        state.metrics.listeners.dec()
        await state.listener_slots.release(lease)
    timeout = state.settings.streams.listener_send_timeout_s
    if isinstance(error, SubscriberLagged):
        await _close_with(
            websocket,
            ProtocolError(ErrorCode.SLOW_CONSUMER, CloseCode.POLICY_VIOLATION, str(error)),
            timeout,
        )
    elif isinstance(error, ProtocolError):
        await _close_with(websocket, error, timeout)
    elif error is not None and not isinstance(error, WebSocketDisconnect):
        logger.error("listener failed", exc_info=error)
        await _close_with(
            websocket,
            ProtocolError(
                ErrorCode.INTERNAL, CloseCode.INTERNAL_ERROR, "internal error; see server log"
            ),
            timeout,
        )


async def _serve_listener(
    websocket: WebSocket, state: AppState, meeting_id: str, after_seq: int, owner: OwnerCheck
) -> BaseException | None:
    """Forward events until the listener leaves or fails; return what ended it."""
    async with state.store.subscribe(meeting_id) as events:
        watcher = asyncio.create_task(_watch_listener(websocket))
        forwarder = asyncio.create_task(
            _forward(websocket, state, meeting_id, after_seq, events, owner)
        )
        done, pending = await asyncio.wait(
            {watcher, forwarder}, return_when=asyncio.FIRST_COMPLETED
        )
        await cancel_and_wait(pending)  # the forwarder may be inside a Redis call
        for task in pending:
            if not task.cancelled():
                task.exception()  # retrieved: ended by the cancel, nothing to report
        # Both may end in one turn of the loop (the client left while an event was on its
        # way): take each one's exception, or asyncio logs the other as never retrieved.
        # What ended it besides the client leaving comes first (a bug is logged).
        errors = [error for task in done if (error := task.exception()) is not None]
        errors.sort(key=lambda error: isinstance(error, WebSocketDisconnect))
        return errors[0] if errors else None


async def _forward(
    websocket: WebSocket,
    state: AppState,
    meeting_id: str,
    after_seq: int,
    events: AsyncIterator[bytes],
    owner: OwnerCheck,
) -> None:
    # Subscribed first, then read the log: nothing falls between the two; finals seen in
    # the log are skipped when they come again live. The log's finals go out in meeting
    # time (across sources), the live ones as they are logged. Nothing is sent before the meeting's
    # owner is confirmed; a listener that does not take a message in time is dropped.
    if after_seq > await state.store.last_seq(meeting_id):
        after_seq = 0  # the log is younger than the client's view (an in-memory store restarted)
    timeout = state.settings.streams.listener_send_timeout_s
    sent = after_seq
    backlog = await state.store.finals(meeting_id, after_seq)
    for record in in_meeting_order(backlog):  # the replay in meeting time; live in seq order
        await owner.confirm()
        await _send(websocket, encode(transcript_final(record)), timeout)
        sent = max(sent, record.seq)
    async for event in events:
        message = orjson.loads(event)
        if message["type"] == "transcript.final" and message["seq"] <= sent:
            continue
        await owner.confirm()
        await _send(websocket, event.decode(), timeout)


async def _send(websocket: WebSocket, text: str, timeout: float) -> None:
    try:
        async with asyncio.timeout(timeout):
            await websocket.send_text(text)
    except TimeoutError:
        raise SubscriberLagged(f"listener took no message for {timeout:g} s") from None


async def _watch_listener(websocket: WebSocket) -> None:
    """A listener only listens: keepalives are fine, audio is refused, a close ends it."""
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
        if message.get("bytes") is not None:
            raise ProtocolError(
                ErrorCode.UNSUPPORTED_DATA,
                CloseCode.UNSUPPORTED_DATA,
                "a listener socket accepts no audio; stream on /v1/meetings/{id}/stream",
            )


async def _close_with(websocket: WebSocket, error: ProtocolError, timeout: float) -> None:
    try:
        async with asyncio.timeout(timeout):  # a listener that reads nothing gets no longer
            await websocket.send_text(encode(error.to_message()))
            await websocket.close(error.close_code, close_reason(error.message))
    except (RuntimeError, WebSocketDisconnect, OSError, TimeoutError):
        logger.debug("listener went away before its close", exc_info=True)
