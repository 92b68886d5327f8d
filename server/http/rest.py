"""HTTP routes: meeting tokens, the meeting transcript, liveness and readiness."""

from __future__ import annotations

import logging

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server.auth.access import client_host
from server.auth.keys import Principal, Scope, bearer, meeting_access, unauthorized
from server.auth.tokens import TokenQuotaExceeded
from server.limits import overloaded, quota_exceeded
from server.metrics import CONTENT_TYPE
from server.state import ModelState, app_state
from store.errors import StoreError
from wire.codes import CloseCode, ErrorCode
from wire.errors import ProtocolError
from wire.query import validate_id
from wire.transcript import TranscriptFormat, render

logger = logging.getLogger(__name__)

MAX_TOKEN_REQUEST = 4096  # bytes of a token request's JSON body


def _problem(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def refusal(error: ProtocolError) -> JSONResponse:
    """The HTTP form of a refusal: 4xxx close codes mirror their HTTP status."""
    close = int(error.close_code)
    status = close - 4000 if close >= 4000 else 503 if close == CloseCode.TRY_AGAIN_LATER else 400
    response = _problem(status, error.code.value, error.message)
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="parley"'
    if error.retry_after is not None:
        response.headers["Retry-After"] = str(round(error.retry_after))
    return response


async def mint_token(request: Request) -> Response:
    """POST /v1/meetings/{id}/tokens (API key) — a single-use token for one browser
    connection to the meeting: `{token, expires_at, meeting_id, scope, participant}`.
    Optional JSON body: `scope` (stream|events|transcript), `participant`, `ttl_s`."""
    state = app_state(request)
    auth = state.auth
    try:
        auth.admit(client_host(request))
        principal = auth.key_principal(bearer(request.headers.get("authorization")))
        meeting_id = validate_id("meeting_id", request.path_params["meeting_id"])
        scope, participant, ttl_s = _token_request(await _small_body(request))
        await meeting_access(state.store, meeting_id, principal)
        token, expires_at = await auth.mint(
            principal, meeting_id, scope=scope, participant=participant, ttl_s=ttl_s
        )
    except ProtocolError as exc:
        return refusal(exc)
    except TokenQuotaExceeded as exc:
        return refusal(quota_exceeded(str(exc)))
    except StoreError as exc:
        return refusal(overloaded(f"token store: {exc}"))
    body = {
        "token": token,
        "expires_at": expires_at,
        "meeting_id": meeting_id,
        "scope": None if scope is None else scope.value,
        "participant": participant,
    }
    return JSONResponse(body, status_code=201, headers={"Cache-Control": "no-store"})


async def _small_body(request: Request) -> bytes:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_TOKEN_REQUEST:
            raise _bad(f"request body over {MAX_TOKEN_REQUEST} bytes")
    return body


def _bad(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_CONFIG, CloseCode.BAD_REQUEST, message)


def _token_request(body: bytes) -> tuple[Scope | None, str | None, float | None]:
    if not body.strip():
        return None, None, None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise _bad("the body must be a JSON object") from None
    if not isinstance(data, dict):
        raise _bad("the body must be a JSON object")
    raw_scope, participant, ttl_s = data.get("scope"), data.get("participant"), data.get("ttl_s")
    try:
        scope = None if raw_scope is None else Scope(raw_scope)
    except (ValueError, TypeError):
        raise _bad("scope must be one of: " + ", ".join(s.value for s in Scope)) from None
    if participant is not None:
        if not isinstance(participant, str):
            raise _bad("participant must be a string")
        validate_id("participant", participant)
    if ttl_s is not None and (
        isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not ttl_s > 0
    ):
        raise _bad("ttl_s must be a positive number of seconds")
    return scope, participant, None if ttl_s is None else float(ttl_s)


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
    try:  # after the cheap checks: a meeting token is spent here
        principal = await _reader(request, meeting_id)
        if not await meeting_access(state.store, meeting_id, principal):
            return _problem(404, "not_found", f"meeting {meeting_id!r} has no transcript")
    except ProtocolError as exc:
        return refusal(exc)
    try:
        finals = await state.store.finals(meeting_id)
        if not finals and await state.store.last_seq(meeting_id) == 0:
            return _problem(404, "not_found", f"meeting {meeting_id!r} has no transcript")
    except StoreError as exc:  # unreachable: 503 with Retry-After, as store/api.py promises
        return refusal(overloaded(f"meeting store: {exc}"))
    return Response(render(meeting_id, finals, fmt), media_type=fmt.media_type)


async def _reader(request: Request, meeting_id: str) -> Principal:
    """Who reads a transcript: an API key or a meeting token as the bearer, or a meeting
    token in `access_token` (the browser's download link)."""
    auth = app_state(request).auth
    auth.admit(client_host(request))
    principal = await auth.presented(
        request.headers.get("authorization"),
        request.query_params.get("access_token"),
        meeting_id,
        Scope.TRANSCRIPT,
    )
    if principal is None:
        raise unauthorized("authentication required: Authorization: Bearer <api key>")
    return principal


async def healthz(request: Request) -> Response:
    """The process is alive and its event loop answers."""
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Ready when the model is loaded and warmed, the scheduler runs, the store answers,
    and the node takes new streams: 503 with the reason while it drains or is at
    capacity (`max_sessions`), so a balancer sends new streams to another node.

    A dead engine (the scheduler's loop died) is not ready, with its reason: nothing will
    be transcribed again until the process restarts. Nor is one whose model worker
    processes are all down (died or hung, being restarted): ready again once one is up.
    The model's measured capacity (`checks.capacity`) is reported but leaves the node
    ready (`degraded`): it refuses new streams while it lasts, but still serves resumes,
    listeners, reads and uploads."""
    state = app_state(request)
    checks: dict[str, str] = {"model": state.model_state.value}
    reasons: list[str] = []
    if state.model_state is ModelState.FAILED:
        reasons.append(f"model failed to load: {state.model_error}")
    elif state.model_state is ModelState.LOADING:
        reasons.append("model is loading")
    scheduler = state.scheduler
    checks["scheduler"] = "stopped" if scheduler is None else scheduler.state.value
    death = None if scheduler is None else scheduler.death
    if death is not None:
        reasons.append(str(death))
    workers = state.worker_health()
    if workers is not None:
        checks["model_workers"] = f"{workers.alive}/{workers.processes}"
        if workers.alive == 0:
            reasons.append(
                "no model worker process is up (each is being restarted); finals wait for one"
            )
    health = await state.store.health()
    checks["store"] = "ok" if health.ok else "degraded"
    if not health.ok:
        reasons.append(f"store {health.backend}: {health.reason}")
    draining = state.registry.state.value == "draining"
    checks["draining"] = str(draining).lower()
    full = state.registry.full()
    checks["sessions"] = "draining" if draining else ("full" if full else "ok")
    if full is not None:
        reasons.append(f"draining: {full}" if draining else f"at capacity: {full}")
    checks["upload_sandbox"] = state.jobs.sandbox.describe()
    refusal = state.capacity.refusal(scheduler)
    checks["capacity"] = "ok" if refusal is None else "full"
    if refusal is not None:
        reasons.append(f"new streams refused: {refusal}")
    ready = (
        state.model_state is ModelState.READY
        and full is None
        and death is None
        and (workers is None or workers.alive > 0)
    )
    body = {
        "ready": ready,
        "status": "ready" if ready and not reasons else ("degraded" if ready else "not_ready"),
        "checks": checks,
        "reasons": reasons,
        "model": state.recognizer_name or state.settings.model.model,
        "sessions": len(state.registry),
        "access": state.auth.access.value,  # keys, protected or anonymous (server/auth/access.py)
        "node": state.store.node_id,
    }
    return JSONResponse(body, status_code=200 if ready else 503)


async def metrics(request: Request) -> Response:
    """Prometheus text exposition of the server's metrics."""
    state = app_state(request)
    return Response(state.metrics.render(), media_type=CONTENT_TYPE)
