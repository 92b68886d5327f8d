"""The compat WebSocket endpoints: Deepgram's `/v1/listen`, Deepgram Flux's `/v2/listen`
and OpenAI's `/v1/realtime`.

Each authenticates in the vendor's terms, builds a protocol v1 stream config, and hands
the socket, wrapped in its codec, to `serve_source`: the same admission, quotas, store,
limits, actor and metrics as a protocol v1 stream. Meeting and participant come from the
extra query parameters `meeting_id` and `participant`; without `meeting_id` each
connection is a meeting of its own, named after its request (Deepgram) or session
(OpenAI) id, so its transcript can be read back at `/v1/meetings/{id}/transcript`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import uuid
from collections.abc import Callable
from functools import partial

from starlette.websockets import WebSocket, WebSocketDisconnect

from server.compat import deepgram, deepgram_errors, flux, openai_realtime
from server.compat.bridge import (
    CompatHandshake,
    TranslatingConnection,
    compat_principal,
    subprotocol_credential,
)
from server.compat.deepgram_channels import DeepgramChannels
from server.limits import overloaded
from server.registry import AdmissionRefused
from server.sockets.channels import bind_participant, channel_configs, serve_channels
from server.sockets.gate import Handshake, refuse
from server.sockets.stream import serve_source
from server.state import AppState, app_state
from session.stream_state import Connection
from wire.codes import CloseCode, ErrorCode
from wire.errors import ProtocolError
from wire.query import StreamConfig, validate_id

logger = logging.getLogger(__name__)

DEEPGRAM_SCHEMES = ("token", "bearer")
OPENAI_SUBPROTOCOL = "realtime"
OPENAI_KEY_SUBPROTOCOL = "openai-insecure-api-key."  # + a meeting token (never an API key)
OPENAI_BETA_SUBPROTOCOL = "openai-beta.realtime-v1"  # a browser's OpenAI-Beta: realtime=v1


async def listen_endpoint(websocket: WebSocket) -> None:
    """Deepgram live streaming."""
    state = app_state(websocket)
    request_id = str(uuid.uuid4())
    handshake, token = _deepgram_handshake(websocket, request_id, deepgram_errors.farewell)
    query = dict(websocket.query_params)
    try:
        meeting_id = query.get("meeting_id") or request_id
        principal = await compat_principal(
            handshake, state.auth, meeting_id, schemes=DEEPGRAM_SCHEMES, subprotocol_token=token
        )
        options = deepgram.parse_options(
            query,
            meeting_id=meeting_id,
            default_language=state.settings.streams.default_language,
            keyterms=websocket.query_params.getlist("keyterm"),
            keywords=websocket.query_params.getlist("keywords"),
            max_channels=state.settings.streams.max_channels,
            redact=websocket.query_params.getlist("redact"),
        )
        config = bind_participant(options.stream_config(), principal, _named(query))
        names = options.channel_names()
        configs = channel_configs(config, names, principal.participant) if names else []
    except WebSocketDisconnect:
        return
    except ProtocolError as exc:
        await refuse(state, handshake, exc)
        return
    codecs = [
        deepgram.DeepgramCodec(
            options, request_id=request_id, model_name=state.recognizer_name or "loading", channel=c
        )
        for c in range(max(1, len(configs)))
    ]
    connection = TranslatingConnection(
        websocket,
        DeepgramChannels(codecs) if configs else codecs[0],
        max_frame_bytes=state.settings.streams.max_frame_bytes,
    )

    async def serve(shake: Handshake, config: StreamConfig, socket: Connection) -> None:
        await serve_source(
            state, shake, config, {}, principal, connection=socket, acknowledge_finalize=True
        )

    if configs:  # one source per channel (server/sockets/channels.py)
        await serve_channels(handshake, connection, configs, serve)
    else:
        await serve(handshake, config, connection)


async def flux_endpoint(websocket: WebSocket) -> None:
    """Deepgram Flux: conversational recognition with turn events (server/compat/flux.py)."""
    state = app_state(websocket)
    request_id = str(uuid.uuid4())
    handshake, token = _deepgram_handshake(
        websocket, request_id, partial(flux.farewell, request_id)
    )
    query = dict(websocket.query_params)
    try:
        meeting_id = query.get("meeting_id") or request_id
        principal = await compat_principal(
            handshake, state.auth, meeting_id, schemes=DEEPGRAM_SCHEMES, subprotocol_token=token
        )
        options = flux.parse_options(
            query, meeting_id=meeting_id, keyterms=websocket.query_params.getlist("keyterm")
        )
        multi = options.model.endswith("multi")
        language = "auto" if multi else state.settings.streams.default_language
        config = bind_participant(options.stream_config(language), principal, _named(query))
    except WebSocketDisconnect:
        return
    except ProtocolError as exc:
        await refuse(state, handshake, exc)
        return
    codec = flux.FluxCodec(
        options, request_id=request_id, server_threshold=state.settings.turns.turn_threshold
    )
    connection = TranslatingConnection(
        websocket, codec, max_frame_bytes=state.settings.streams.max_frame_bytes
    )
    await serve_source(
        state, handshake, config, {}, principal, connection=connection, acknowledge_finalize=True
    )


async def realtime_endpoint(websocket: WebSocket) -> None:
    """OpenAI realtime transcription sessions (`intent=transcription`)."""
    state = app_state(websocket)
    session_id = "sess_" + secrets.token_hex(12)
    offered = [str(p) for p in websocket.scope.get("subprotocols") or []]
    token = next(
        (p[len(OPENAI_KEY_SUBPROTOCOL) :] for p in offered if p.startswith(OPENAI_KEY_SUBPROTOCOL)),
        None,
    )
    codec = openai_realtime.RealtimeCodec(
        session_id=session_id,
        beta="realtime=v1" in websocket.headers.get("openai-beta", "")
        or OPENAI_BETA_SUBPROTOCOL in offered,
        vad=_vad(state),
        default_language=state.settings.streams.default_language,
        model=websocket.query_params.get("model") or "whisper-1",
        semantic=state.services is not None and state.services.turns is not None,
    )
    handshake = CompatHandshake(
        websocket,
        denial=openai_realtime.denial,
        farewell=codec.farewell,
        subprotocol=OPENAI_SUBPROTOCOL if OPENAI_SUBPROTOCOL in offered else None,
    )
    query = dict(websocket.query_params)
    connection = TranslatingConnection(
        websocket, codec, max_frame_bytes=state.settings.streams.max_frame_bytes
    )
    try:
        meeting_id = validate_id("meeting_id", query.get("meeting_id") or session_id)
        participant = validate_id("participant", query.get("participant", "speaker"))
        if query.get("intent", "transcription") != "transcription":
            raise ProtocolError(
                ErrorCode.BAD_CONFIG,
                CloseCode.BAD_REQUEST,
                "only transcription sessions are served here: connect with intent=transcription",
            )
        principal = await compat_principal(
            handshake, state.auth, meeting_id, schemes=("bearer",), subprotocol_token=token
        )
        unavailable = state.unavailable()
        if unavailable is not None:
            raise overloaded(unavailable)
        # The session is configured by messages, before its audio: serve them first, in a
        # place held against the stream bound, cut short by a drain.
        with state.registry.waiting():
            await handshake.accept()
            await websocket.send_text(codec.created())
            if not await _configured(state, connection):
                return
        config = bind_participant(codec.stream_config(meeting_id, participant), principal, query)
    except TimeoutError:  # before OSError, its base class
        error = ProtocolError(
            ErrorCode.TIMEOUT,
            CloseCode.TIMEOUT,
            f"no audio for {state.settings.streams.idle_timeout_s:g} s",
        )
        await refuse(state, handshake, error)
        return
    except AdmissionRefused as exc:
        await refuse(state, handshake, overloaded(exc.reason))
        return
    except ProtocolError as exc:
        await refuse(state, handshake, exc)
        return
    except (WebSocketDisconnect, OSError):
        return
    except Exception:  # a bug while configuring: the documented 1011, not a dropped socket
        logger.exception("realtime session %s failed while configuring", session_id)
        internal = ProtocolError(
            ErrorCode.INTERNAL, CloseCode.INTERNAL_ERROR, "internal error; see server log"
        )
        await refuse(state, handshake, internal)
        return
    await serve_source(
        state, handshake, config, {}, principal, connection=connection, acknowledge_finalize=True
    )


async def _configured(state: AppState, connection: TranslatingConnection) -> bool:
    """Serve a realtime session's events until its first audio (or commit): False if the
    client left first. TimeoutError past the idle limit; ProtocolError (1012) if the
    server starts draining meanwhile."""
    async with asyncio.timeout(state.settings.streams.idle_timeout_s):
        primed = asyncio.ensure_future(connection.prime())
        draining = asyncio.ensure_future(state.registry.draining.wait())
        try:
            await asyncio.wait({primed, draining}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            draining.cancel()
            if not primed.done():
                primed.cancel()
                await asyncio.gather(primed, return_exceptions=True)
    if not primed.done() or primed.cancelled():
        raise ProtocolError(
            ErrorCode.SHUTTING_DOWN, CloseCode.SERVICE_RESTART, "server is shutting down"
        )
    return primed.result()


def _named(query: dict[str, str]) -> dict[str, str]:
    """The query as `bind_participant` reads it: whether a participant was named."""
    return {"participant": query["participant"]} if "participant" in query else {}


def _vad(state: AppState) -> openai_realtime.Vad:
    settings = state.settings
    return openai_realtime.Vad(
        threshold=settings.segmenter.vad_threshold,
        prefix_padding_ms=round(settings.segmenter.pre_roll_ms),
        silence_duration_ms=round(settings.segmenter.min_silence_ms),
    )


def _deepgram_handshake(
    websocket: WebSocket, request_id: str, farewell: Callable[[ProtocolError], str]
) -> tuple[CompatHandshake, str | None]:
    """The handshake of Deepgram's sockets (`/v1/listen`, Flux's `/v2/listen`): its error
    answers and `dg-request-id`, and the token a client offered as a subprotocol."""
    offered = [str(p) for p in websocket.scope.get("subprotocols") or []]
    via_subprotocol = subprotocol_credential(offered, DEEPGRAM_SCHEMES)
    handshake = CompatHandshake(
        websocket,
        denial=deepgram_errors.denial(request_id),
        farewell=farewell,
        headers={"dg-request-id": request_id},
        subprotocol=via_subprotocol[0] if via_subprotocol else None,
    )
    return handshake, via_subprotocol[1] if via_subprotocol else None
