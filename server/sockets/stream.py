"""The WebSocket endpoint of one audio source: its stream, opened or resumed, served by
a session actor (a meeting's listener feed is server/sockets/listeners.py)."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass

from starlette.websockets import WebSocket, WebSocketDisconnect

from server.auth.keys import (
    Principal,
    Scope,
    create_owned_source,
    forbidden,
    meeting_access,
)
from server.limits import LimitedConnection, RealtimeBudget, StreamSlot, overloaded
from server.registry import AdmissionRefused
from server.sockets.gate import Handshake, authenticate_socket, non_negative, refuse
from server.state import AppState, app_state
from session.actor import SessionActor
from session.enrolled import load_voices
from session.resume_context import ResumeContext, resume_context
from session.services import SessionServices
from session.stream_state import Connection
from store.api import Store
from store.errors import ResumeRefused, StoreError, UnknownResumeToken
from store.records import FinalRecord, SourceState
from wire.codes import CloseCode, ErrorCode
from wire.errors import ProtocolError
from wire.query import StreamConfig, parse_stream_config

logger = logging.getLogger(__name__)


async def stream_endpoint(websocket: WebSocket) -> None:
    state = app_state(websocket)
    handshake = Handshake(websocket)
    query = dict(websocket.query_params)
    terms = websocket.query_params.getlist("keyterm")  # the one parameter that repeats
    meeting_id = websocket.path_params["meeting_id"]
    try:
        principal = await authenticate_socket(state, handshake, meeting_id, Scope.STREAM)
        config = bind_participant(
            parse_stream_config(meeting_id, query, state.settings.streams.default_language, terms),
            principal,
            query,
        )
    except WebSocketDisconnect:
        return
    except ProtocolError as exc:
        await refuse(state, handshake, exc)
        return
    await serve_source(state, handshake, config, query, principal)


async def serve_source(
    state: AppState,
    handshake: Handshake,
    config: StreamConfig,
    query: dict[str, str],
    principal: Principal,
    *,
    connection: Connection | None = None,
    acknowledge_finalize: bool = False,
) -> None:
    """Admit and serve one authenticated audio source: capacity, the tenant's quota, the
    meeting's source in the store, limits, the session actor. Protocol v1 streams and the
    compat adapters (server/compat/) share every step; an adapter passes `connection`, its
    translating wrapper of the socket, and refuses through its own `handshake`."""
    resuming = "resume_token" in query
    slot = StreamSlot(
        state.store.quotas, principal.tenant, state.settings.streams.max_streams_per_key
    )
    try:
        services = _services_or_refuse(state)
        _check_capacity(state, resumed=resuming)
        if not resuming:  # a resumed source takes its own slot over once it is known
            await slot.take()
    except ProtocolError as exc:
        await refuse(state, handshake, exc)
        return
    try:
        await _serve_stream(
            state,
            handshake,
            services,
            config,
            query,
            principal,
            slot,
            connection or handshake.websocket,
            acknowledge_finalize,
        )
    finally:
        await slot.release()


async def _serve_stream(
    state: AppState,
    handshake: Handshake,
    services: SessionServices,
    config: StreamConfig,
    query: dict[str, str],
    principal: Principal,
    slot: StreamSlot,
    socket: Connection,
    acknowledge_finalize: bool,
) -> None:
    try:
        opened = await _open_source(state.store, config, query, principal, services)
        await slot.bind(opened.source.session_id)
        _check_language(opened.config.language, services.languages, state.recognizer_name)
        if opened.config.diarize and services.speakers is None:
            raise ProtocolError(ErrorCode.BAD_CONFIG, CloseCode.BAD_REQUEST, services.speakers_off)
    except ProtocolError as exc:
        await refuse(state, handshake, exc)
        return
    budget = None
    if not principal.fast_replay:
        lead = opened.context.resume_from - opened.context.send_from if opened.context else 0.0
        budget = RealtimeBudget(  # the re-sent lead (send_from) does not count
            state.settings.streams.realtime_factor,
            state.settings.streams.realtime_burst_s + lead,
            time.monotonic(),
        )
    connection = LimitedConnection(
        socket,
        idle_timeout_s=state.settings.streams.idle_timeout_s,
        max_duration_s=state.settings.streams.max_session_s,
        budget=budget,
        bytes_per_second=config.sample_rate * config.encoding.sample_width,
    )
    actor = SessionActor(
        websocket=connection,
        config=opened.config,
        services=services,
        source=opened.source,
        resume_token=opened.token,
        replay=opened.replay,
        resumed=opened.resumed,
        context=opened.context,
        acknowledge_finalize=acknowledge_finalize,
        enrolled=(
            await load_voices(state.store, principal.tenant, services.speaker_match)
            if opened.config.diarize
            else None
        ),
    )
    try:
        state.registry.admit(actor, resumed=opened.resumed)
    except AdmissionRefused as exc:
        await refuse(state, handshake, overloaded(exc.reason))
        return
    try:
        if opened.resumed:  # the node still serving the old connection closes it (4409)
            await state.store.takeovers.announce(config.meeting_id, actor.session_id)
        await handshake.accept()
        reason = await actor.run()
        logger.info(
            "session ended",
            extra={
                "session_id": actor.session_id,
                "meeting_id": config.meeting_id,
                "tenant": principal.tenant,
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


def _services_or_refuse(state: AppState) -> SessionServices:
    reason = state.unavailable()
    if reason is not None or state.services is None:
        raise overloaded(reason or "model is not ready")
    return state.services


def _check_capacity(state: AppState, *, resumed: bool) -> None:
    """Refuse a stream (1013) past the stream bound or, a new one, past the model's
    measured capacity. A resumed stream may use the resume headroom (see
    SessionRegistry.check_room): its words were already being transcribed somewhere."""
    try:
        state.registry.check_room(resumed=resumed)
    except AdmissionRefused as exc:
        raise overloaded(exc.reason) from None
    if resumed:
        return
    reason = state.capacity.refusal(state.scheduler)
    if reason is not None:
        raise overloaded(reason)


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


@dataclass(frozen=True, slots=True)
class _OpenedSource:
    config: StreamConfig
    source: SourceState
    token: str
    replay: list[FinalRecord]
    resumed: bool
    context: ResumeContext | None = None  # a resumed source's next final's left context


# A resume reads the meeting's last this-many finals at least: the source's last ones,
# for its next final's left context, are among them unless the others spoke that many since.
RECENT_FINALS = 64


async def _open_source(
    store: Store,
    config: StreamConfig,
    query: dict[str, str],
    principal: Principal,
    services: SessionServices,
) -> _OpenedSource:
    """A new source of the meeting, or the one a `resume_token` names (with the finals the
    client has not seen: this source's finals after `last_seq`, and the left context of
    its next final). Either way, the meeting must be the principal's: a new one becomes
    its (first writer wins)."""
    token = query.get("resume_token")
    meeting_id = config.meeting_id
    try:
        if token is None:
            source, token = await create_owned_source(
                store, meeting_id, config.participant, config.as_dict(), principal
            )
            return _OpenedSource(config, source, token, [], resumed=False)
        await meeting_access(store, meeting_id, principal)
        last_seq = non_negative("last_seq", query.get("last_seq", "0"))
        participant = query.get("participant") or principal.participant
        source = (await store.resume_source(meeting_id, token, participant)).with_origin(
            time.time()
        )
        recent = await store.finals(
            meeting_id,
            after_seq=max(0, min(last_seq, await store.last_seq(meeting_id) - RECENT_FINALS)),
        )
        mine = [f for f in recent if f.session_id == source.session_id]
        replay = [f for f in mine if f.seq > last_seq]
    except UnknownResumeToken as exc:
        raise ProtocolError(ErrorCode.NOT_FOUND, CloseCode.NOT_FOUND, str(exc)) from None
    except ResumeRefused as exc:
        raise ProtocolError(ErrorCode.FORBIDDEN, CloseCode.FORBIDDEN, str(exc)) from None
    except StoreError as exc:
        raise overloaded(f"meeting store: {exc}") from None
    config = dataclasses.replace(config, participant=source.participant)
    if "language" not in query and source.language is not None:
        config = dataclasses.replace(config, language=source.language)  # keep its language
    limit = services.left_context
    languages, language = services.context_languages, config.language
    if language == "auto":
        language = source.language or "auto"
    if languages is not None and language != "auto" and language not in languages:
        limit = 0.0  # as Committer._left_limit: no left context in this language
    context = resume_context(mine, source, limit)
    return _OpenedSource(config, source, token, replay, resumed=True, context=context)
