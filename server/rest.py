"""HTTP routes: the meeting transcript, liveness and readiness."""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server.metrics import CONTENT_TYPE
from server.state import ModelState, app_state
from session.protocol import ProtocolError, validate_id
from session.transcript import TranscriptFormat, render

logger = logging.getLogger(__name__)


def _problem(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


async def transcript(request: Request) -> Response:
    """GET /v1/meetings/{id}/transcript?format=json|txt|srt|vtt — the finals in seq order."""
    state = app_state(request)
    try:
        meeting_id = validate_id("meeting_id", request.path_params["meeting_id"])
    except ProtocolError as exc:
        return _problem(400, exc.code.value, exc.message)
    raw_format = request.query_params.get("format", "json")
    try:
        fmt = TranscriptFormat(raw_format)
    except ValueError:
        known = ", ".join(f.value for f in TranscriptFormat)
        return _problem(400, "bad_format", f"format must be one of: {known}")
    finals = await state.store.finals(meeting_id)
    if not finals and await state.store.last_seq(meeting_id) == 0:
        return _problem(404, "not_found", f"meeting {meeting_id!r} has no transcript")
    return Response(render(meeting_id, finals, fmt), media_type=fmt.media_type)


async def healthz(request: Request) -> Response:
    """The process is alive and its event loop answers."""
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Ready when the model is loaded and warmed, the scheduler runs, the store answers."""
    state = app_state(request)
    checks: dict[str, str] = {"model": state.model_state.value}
    reasons: list[str] = []
    if state.model_state is ModelState.FAILED:
        reasons.append(f"model failed to load: {state.model_error}")
    elif state.model_state is ModelState.LOADING:
        reasons.append("model is loading")
    scheduler = state.scheduler
    checks["scheduler"] = "stopped" if scheduler is None else scheduler.state.value
    health = await state.store.health()
    checks["store"] = "ok" if health.ok else "degraded"
    if not health.ok:
        reasons.append(f"store {health.backend}: {health.reason}")
    checks["draining"] = str(state.registry.state.value == "draining").lower()
    ready = state.model_state is ModelState.READY and state.registry.state.value == "open"
    body = {
        "ready": ready,
        "status": "ready" if ready and not reasons else ("degraded" if ready else "not_ready"),
        "checks": checks,
        "reasons": reasons,
        "model": state.recognizer_name or state.settings.model,
        "sessions": len(state.registry),
    }
    return JSONResponse(body, status_code=200 if ready else 503)


async def metrics(request: Request) -> Response:
    """Prometheus text exposition of the server's metrics."""
    state = app_state(request)
    return Response(state.metrics.render(), media_type=CONTENT_TYPE)
