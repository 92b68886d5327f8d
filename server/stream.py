"""WebSocket endpoints: the audio stream of one source, and a meeting's listener feed."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import orjson
from starlette.websockets import WebSocket, WebSocketDisconnect

from server.registry import AdmissionRefused
from server.state import AppState, app_state
from session.actor import SessionActor
from session.protocol import (
    CloseCode,
    ErrorCode,
    ProtocolError,
    StreamConfig,
    encode,
    error_message,
    parse_stream_config,
    validate_id,
)
from session.store import (
    FinalRecord,
    ResumeRefused,
    SourceState,
    Store,
    StoreError,
    SubscriberLagged,
    UnknownResumeToken,
)

logger = logging.getLogger(__name__)


async def _refuse(websocket: WebSocket, error: ProtocolError) -> None:
    """Accept, say why in an `error` message, and close with the named code."""
    await websocket.accept()
    await websocket.send_text(encode(error_message(error.code, error.message)))
    await websocket.close(error.close_code, error.message[:120])


async def stream_endpoint(websocket: WebSocket) -> None:
    state = app_state(websocket)
    query = dict(websocket.query_params)
    try:
        config = parse_stream_config(
            websocket.path_params["meeting_id"], query, state.settings.default_language
        )
    except ProtocolError as exc:
        await _refuse(websocket, exc)
        return
    services = state.services
    if services is None:
        await _refuse(
            websocket,
            ProtocolError(
                ErrorCode.OVERLOADED,
                CloseCode.TRY_AGAIN_LATER,
                f"model is {state.model_state.value}; retry when /readyz says ready",
            ),
        )
        return
    try:
        opened = await _open_source(state.store, config, query)
        _check_language(opened.config.language, services.languages, state.recognizer_name)
    except ProtocolError as exc:
        await _refuse(websocket, exc)
        return
    actor = SessionActor(
        websocket=websocket,
        config=opened.config,
        services=services,
        source=opened.source,
        resume_token=opened.token,
        replay=opened.replay,
        resumed=opened.resumed,
    )
    try:
        state.registry.admit(actor)
    except AdmissionRefused as exc:
        state.metrics.refused.labels(str(int(CloseCode.TRY_AGAIN_LATER))).inc()
        await _refuse(
            websocket, ProtocolError(ErrorCode.OVERLOADED, CloseCode.TRY_AGAIN_LATER, exc.reason)
        )
        return
    try:
        await websocket.accept()
        reason = await actor.run()
        logger.info(
            "session ended",
            extra={
                "session_id": actor.session_id,
                "meeting_id": config.meeting_id,
                "reason": reason.value,
                "finals": actor.totals.finals,
                "resumed": opened.resumed,
            },
        )
    finally:
        state.registry.release(actor)


def _check_language(language: str, known: frozenset[str], model: str) -> None:
    """Refuse a stream in a language the loaded model does not transcribe."""
    if language == "auto" or language in known:
        return
    if known == {"en"}:
        hint = "it is English-only; start the server with PARLEY_MODEL=base or small"
    else:
        hint = "use another code, or language=auto"
    raise ProtocolError(
        ErrorCode.BAD_CONFIG,
        CloseCode.BAD_REQUEST,
        f"model {model} does not transcribe language {language!r}: {hint}",
    )


@dataclass(frozen=True, slots=True)
class _OpenedSource:
    config: StreamConfig
    source: SourceState
    token: str
    replay: list[FinalRecord]
    resumed: bool


async def _open_source(store: Store, config: StreamConfig, query: dict[str, str]) -> _OpenedSource:
    """A new source of the meeting, or the one a `resume_token` names (with the finals the
    client has not seen: this source's finals after `last_seq`)."""
    token = query.get("resume_token")
    try:
        if token is None:
            source, token = await store.create_source(
                config.meeting_id, config.participant, config.as_dict()
            )
            return _OpenedSource(config, source, token, [], resumed=False)
        last_seq = _non_negative("last_seq", query.get("last_seq", "0"))
        source = await store.resume_source(
            config.meeting_id, token, config.participant if "participant" in query else None
        )
    except UnknownResumeToken as exc:
        raise ProtocolError(ErrorCode.NOT_FOUND, CloseCode.NOT_FOUND, str(exc)) from None
    except ResumeRefused as exc:
        raise ProtocolError(ErrorCode.FORBIDDEN, CloseCode.FORBIDDEN, str(exc)) from None
    except StoreError as exc:
        raise ProtocolError(
            ErrorCode.OVERLOADED, CloseCode.TRY_AGAIN_LATER, f"meeting store: {exc}"
        ) from None
    replay = [
        f
        for f in await store.finals(config.meeting_id, after_seq=last_seq)
        if f.session_id == source.session_id
    ]
    config = dataclasses.replace(config, participant=source.participant)
    if "language" not in query and source.language is not None:
        config = dataclasses.replace(config, language=source.language)  # keep its language
    return _OpenedSource(config, source, token, replay, resumed=True)


async def events_endpoint(websocket: WebSocket) -> None:
    """Listener feed: the meeting's finals so far (after `after_seq`), then every
    `transcript.*` event of every source as it happens."""
    state = app_state(websocket)
    try:
        meeting_id = validate_id("meeting_id", websocket.path_params["meeting_id"])
        after_seq = _non_negative("after_seq", websocket.query_params.get("after_seq", "0"))
    except ProtocolError as exc:
        await _refuse(websocket, exc)
        return
    await websocket.accept()
    state.metrics.listeners.inc()
    try:
        error = await _serve_listener(websocket, state, meeting_id, after_seq)
    finally:
        state.metrics.listeners.dec()
    if isinstance(error, SubscriberLagged):
        await _close_with(
            websocket,
            ProtocolError(ErrorCode.SLOW_CONSUMER, CloseCode.POLICY_VIOLATION, str(error)),
        )
    elif isinstance(error, ProtocolError):
        await _close_with(websocket, error)
    elif error is not None and not isinstance(error, WebSocketDisconnect):
        logger.error("listener failed", exc_info=error)
        await _close_with(
            websocket,
            ProtocolError(
                ErrorCode.INTERNAL, CloseCode.INTERNAL_ERROR, "internal error; see server log"
            ),
        )


async def _serve_listener(
    websocket: WebSocket, state: AppState, meeting_id: str, after_seq: int
) -> BaseException | None:
    """Forward events until the listener leaves or fails; return what ended it."""
    async with state.store.subscribe(meeting_id) as events:
        watcher = asyncio.create_task(_watch_listener(websocket))
        forwarder = asyncio.create_task(_forward(websocket, state, meeting_id, after_seq, events))
        done, pending = await asyncio.wait(
            {watcher, forwarder}, return_when=asyncio.FIRST_COMPLETED
        )
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return next(iter(done)).exception()


def _non_negative(name: str, raw: str) -> int:
    if not raw.isdigit() or len(raw) > 18:
        raise ProtocolError(
            ErrorCode.BAD_CONFIG, CloseCode.BAD_REQUEST, f"{name} must be a non-negative integer"
        )
    return int(raw)


async def _forward(
    websocket: WebSocket,
    state: AppState,
    meeting_id: str,
    after_seq: int,
    events: AsyncIterator[bytes],
) -> None:
    # Subscribed first, then read the log: nothing falls between the two; finals seen in
    # the log are skipped when they come again live.
    if after_seq > await state.store.last_seq(meeting_id):
        after_seq = 0  # the log is younger than the client's view (an in-memory store restarted)
    sent = after_seq
    for record in await state.store.finals(meeting_id, after_seq):
        await websocket.send_text(encode(record.message()))
        sent = record.seq
    async for event in events:
        message = orjson.loads(event)
        if message["type"] == "transcript.final" and message["seq"] <= sent:
            continue
        await websocket.send_text(event.decode())


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


async def _close_with(websocket: WebSocket, error: ProtocolError) -> None:
    try:
        await websocket.send_text(encode(error_message(error.code, error.message)))
        await websocket.close(error.close_code, error.message[:120])
    except (RuntimeError, WebSocketDisconnect, OSError):
        logger.debug("listener went away before its close", exc_info=True)
