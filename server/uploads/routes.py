"""HTTP routes for transcribing uploaded recordings (docs/protocol.md#transcribe-a-file).

- `POST /v1/transcriptions` streams the multipart upload to the job's temp folder
  (counted: 413 past `max_upload_bytes`), decodes it in a sandboxed subprocess (415
  for formats we do not take, 422 for damaged, truncated or too-long audio), then
  answers `202 Accepted` with `Location: /v1/transcriptions/{id}`; with `wait=true`
  it answers `200` with the transcript when the job finishes within `upload_wait_s`.
- `GET /v1/transcriptions/{id}` is the job resource: status, progress, and the result
  when done; `?format=txt|srt|vtt` renders the finished transcript.
- `DELETE /v1/transcriptions/{id}` cancels the job and forgets it.

Any node answers the GET and the DELETE: the node that runs a job keeps it, the others
read its record in the store (server/uploads/records.py) and ask its node to cancel it.

Everything wrong with the file itself is answered on the POST: a 202 means the file is
good audio and will be transcribed.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import math
import re
import time
from collections.abc import Sequence

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from server.auth.access import client_host, is_loopback
from server.auth.keys import ANONYMOUS, Principal, bearer, create_owned_source
from server.settings import Settings
from server.state import app_state
from server.uploads.decode_worker import Refusal
from server.uploads.form import FORM_OVERHEAD, receive_form, too_large
from server.uploads.jobs import Job, JobOptions, JobsFull, JobStatus
from server.uploads.records import StoredJob
from server.uploads.sandbox import unsandboxed
from session.services import SessionServices
from store.errors import StoreError
from wire.codes import CloseCode, ErrorCode
from wire.errors import ProtocolError
from wire.keyterms import parse_keyterms
from wire.query import is_language, parse_flag, validate_id
from wire.transcript import TranscriptFormat

logger = logging.getLogger(__name__)

OPTION_FIELDS = frozenset(
    {"language", "format", "participant", "meeting_id", "wait", "diarize", "started_at", "keyterm"}
)
DEFAULT_PARTICIPANT = "speaker"
RETRY_AFTER_S = "5"
EARLIEST_STARTED_AT = 946_684_800.0  # 2000-01-01T00:00:00Z
JOB_ID = re.compile(r"[0-9a-f]{16}")  # secrets.token_hex(8): others are not looked up


def _problem(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> Response:
    return JSONResponse(
        {"error": {"code": code, "message": message}}, status_code=status, headers=headers
    )


def _parse_options(
    raw: dict[str, str], settings: Settings, keyterms: Sequence[str] = ()
) -> tuple[JobOptions, bool]:
    """Validate the options (query string, then form fields; `keyterms`: every `keyterm`
    given, the one that repeats); raise Refusal (400)."""

    def bad(code: str, message: str) -> Refusal:
        return Refusal(400, code, message)

    try:
        fmt = TranscriptFormat(raw.get("format", "json"))
    except ValueError:
        known = ", ".join(f.value for f in TranscriptFormat)
        raise bad("bad_format", f"format must be one of: {known}") from None
    language = raw.get("language", settings.streams.default_language)
    if not is_language(language):
        raise bad("bad_config", f"language must be an ISO 639-1 code or 'auto', not {language!r}")
    wait = parse_flag(raw.get("wait", "false"))
    if wait is None:
        raise bad("bad_config", "wait must be true or false")
    diarize = parse_flag(raw.get("diarize", "false"))
    if diarize is None:
        raise bad("bad_config", "diarize must be true or false")
    try:
        participant = validate_id("participant", raw.get("participant", DEFAULT_PARTICIPANT))
        meeting_id = raw.get("meeting_id")
        if meeting_id is not None:
            validate_id("meeting_id", meeting_id)
        terms = parse_keyterms(keyterms)
    except ProtocolError as exc:
        raise bad(exc.code.value, exc.message) from None
    started_at = None
    if "started_at" in raw:
        started_at = parse_started_at(raw["started_at"])
        if started_at is None:
            raise bad(
                "bad_config",
                "started_at must be Unix seconds or an RFC 3339 time with its offset "
                "(2026-12-02T01:10:00Z), within a day from now and after 2000",
            )
    options = JobOptions(
        language=None if language == "auto" else language,
        participant=participant,
        labelled="participant" in raw,
        meeting_id=meeting_id,
        format=fmt,
        diarize=diarize,
        started_at=started_at,
        keyterms=terms,
    )
    return options, wait


def parse_started_at(raw: str, now: float | None = None) -> float | None:
    """`started_at` as Unix seconds (to the ms): a number, or an RFC 3339 / ISO 8601 time
    with its UTC offset. None if it is neither, or lies before 2000 or past a day from
    `now` (a clock or unit mistake, e.g. milliseconds)."""
    text = raw.strip()
    try:
        value = float(text)
    except ValueError:
        try:
            parsed = datetime.datetime.fromisoformat(text)
        except ValueError:
            return None
        if parsed.tzinfo is None:
            return None  # a local time names no instant
        value = parsed.timestamp()
    now = time.time() if now is None else now
    if not math.isfinite(value) or not EARLIEST_STARTED_AT <= value <= now + 86_400:
        return None
    return round(value, 3)


def _check_language(language: str | None, known: frozenset[str], model: str) -> None:
    """Refuse (400) a language the loaded model does not transcribe, as streams do."""
    if language is None or language in known:
        return
    hint = (
        "it is English-only; start the server with PARLEY_MODEL=base or small"
        if known == {"en"}
        else "use another code, or language=auto"
    )
    raise Refusal(
        400, "bad_config", f"model {model} does not transcribe language {language!r}: {hint}"
    )


def _check_diarize(diarize: bool, services: SessionServices) -> None:
    if diarize and services.speakers is None:
        raise Refusal(400, "bad_config", services.speakers_off)


# Body bytes read and dropped before an early refusal (no key, bad options, no model, no job
# slot): a server that closes with unread bytes makes the kernel reset the connection, and
# the client may lose the answer to a "connection reset". Bigger bodies are cut off.
DRAIN_BEFORE_REFUSAL = 1 << 20
DRAIN_TIMEOUT_S = 2.0


async def _refuse(
    request: Request, status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> Response:
    """`_problem`, after reading what is cheap of the request's body (see above)."""
    drained = 0
    try:
        async with asyncio.timeout(DRAIN_TIMEOUT_S):
            async for chunk in request.stream():
                drained += len(chunk)
                if drained > DRAIN_BEFORE_REFUSAL:
                    break
    except (ClientDisconnect, TimeoutError):
        pass
    return _problem(status, code, message, headers)


async def create_transcription(request: Request) -> Response:
    """POST /v1/transcriptions — upload a recording; 202 + Location, or 200 with `wait=true`."""
    state = app_state(request)
    settings = state.settings
    try:
        tenant = _tenant_of(request)
    except ProtocolError as exc:
        return await _refuse(request, _auth_status(exc), exc.code.value, exc.message)
    missing = state.jobs.sandbox.missing
    if missing is not None and not is_loopback(client_host(request)):
        code = ErrorCode.SANDBOX_UNAVAILABLE.value
        return await _refuse(request, 503, code, unsandboxed(missing))
    query = {k: v for k, v in request.query_params.items() if k in OPTION_FIELDS}
    unknown = set(request.query_params) - OPTION_FIELDS
    if unknown:
        return await _refuse(
            request, 400, "bad_request", f"unknown query parameter {sorted(unknown)[0]!r}"
        )
    try:
        keyterms = request.query_params.getlist("keyterm")
        options, wait = _parse_options(query, settings, keyterms)
    except Refusal as exc:
        return await _refuse(request, exc.status, exc.code, exc.message)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > settings.uploads.max_upload_bytes + FORM_OVERHEAD:
        refused = too_large(settings.uploads.max_upload_bytes)  # say so before a byte is sent
        return _problem(refused.status, refused.code, refused.message)
    services, file_vad = state.services, state.file_vad
    unavailable = state.unavailable()
    if unavailable is not None or services is None or file_vad is None:
        return await _refuse(
            request,
            503,
            "overloaded",
            unavailable or "model is not ready",
            {"Retry-After": RETRY_AFTER_S},
        )
    try:
        _check_language(options.language, services.languages, state.recognizer_name)
        _check_diarize(options.diarize, services)
    except Refusal as exc:
        return await _refuse(request, exc.status, exc.code, exc.message)
    try:
        job = state.jobs.admit(options)
    except JobsFull as exc:
        return await _refuse(request, 503, "overloaded", str(exc), {"Retry-After": RETRY_AFTER_S})
    job.tenant = tenant
    try:
        form = await receive_form(
            request.stream(),
            request.headers.get("content-type", ""),
            job.workdir / "upload",
            max_file_bytes=settings.uploads.max_upload_bytes,
            fields=OPTION_FIELDS,
            idle_timeout_s=settings.uploads.upload_idle_timeout_s,
            receive_timeout_s=settings.uploads.upload_receive_timeout_s,
        )
        form_terms = [form.fields["keyterm"]] if "keyterm" in form.fields else []
        options, wait = _parse_options({**query, **form.fields}, settings, keyterms + form_terms)
        _check_language(options.language, services.languages, state.recognizer_name)
        _check_diarize(options.diarize, services)
        job.options = options
        job.filename = form.filename[:256]
        job.upload_bytes = form.size
        audio = await state.jobs.decode(job, form.path)
        source = None
        if options.meeting_id is not None:  # the file becomes a source of the meeting
            principal = ANONYMOUS if tenant is None else Principal(tenant, fast_replay=True)
            source, _ = await create_owned_source(  # another tenant's: 4403 → 403
                state.store,
                options.meeting_id,
                options.participant,
                {},
                principal,
                origin=job.created_at if options.started_at is None else options.started_at,
            )
        await state.jobs.start(job, audio, services, file_vad, source)
    except Refusal as exc:
        await state.jobs.discard(job)
        logger.info("upload refused: %s %s: %s", exc.status, exc.code, exc.message)
        return _problem(exc.status, exc.code, exc.message)
    except ProtocolError as exc:  # the meeting belongs to another tenant
        await state.jobs.discard(job)
        return _problem(403, exc.code.value, exc.message)
    except (JobsFull, StoreError) as exc:
        await state.jobs.discard(job)
        return _problem(503, "overloaded", str(exc), {"Retry-After": RETRY_AFTER_S})
    except ClientDisconnect:
        await state.jobs.discard(job)
        logger.info("upload abandoned: the client disconnected")
        return Response(status_code=400)
    except BaseException:
        await state.jobs.discard(job)
        raise
    if wait:
        return await _answer_when_done(job, settings.uploads.upload_wait_s)
    return _accepted(job)


def _accepted(job: Job) -> Response:
    return JSONResponse(job.describe(), status_code=202, headers={"Location": job.location})


async def _answer_when_done(job: Job, timeout: float) -> Response:
    try:
        await asyncio.wait_for(job.finished.wait(), timeout)
    except TimeoutError:
        return _accepted(job)  # still running: poll the Location
    headers = {"Content-Location": job.location}
    if job.status is JobStatus.DONE:
        fmt = job.options.format
        return Response(job.render(fmt), media_type=fmt.media_type, headers=headers)
    error = job.error or {"code": "cancelled", "message": "the job was cancelled"}
    status = 500 if error["code"] == "internal" else 503
    return _problem(status, error["code"], error["message"], headers)


def _tenant_of(request: Request) -> str | None:
    """With authentication on, uploads take an API key (`Authorization: Bearer`); its
    tenant owns the job. None while authentication is off. Raises ProtocolError (401; 403
    `protected_mode` for a client that protected mode keeps out)."""
    auth = app_state(request).auth
    auth.admit(client_host(request))
    return auth.key_principal(bearer(request.headers.get("authorization"))).tenant


def _tenant(request: Request) -> str | Response | None:
    """`_tenant_of`, with the refusal as a 401 response (requests without a body)."""
    try:
        return _tenant_of(request)
    except ProtocolError as exc:
        return _problem(_auth_status(exc), exc.code.value, exc.message)


def _auth_status(error: ProtocolError) -> int:
    return 403 if error.close_code == CloseCode.FORBIDDEN else 401


async def _job(request: Request) -> Job | StoredJob | Response:
    """The job: this node's own, else as its node last wrote it in the store."""
    tenant = _tenant(request)
    if isinstance(tenant, Response):
        return tenant
    state = app_state(request)
    job_id = request.path_params["job_id"]
    job: Job | StoredJob | None = state.jobs.get(job_id)
    if job is None and JOB_ID.fullmatch(job_id):
        try:
            entry = await state.store.jobs.get(job_id)
        except StoreError as exc:
            return _problem(503, "overloaded", f"job store: {exc}", {"Retry-After": RETRY_AFTER_S})
        if entry is not None:
            job = StoredJob.from_entry(job_id, entry, state.settings.store.node_lease_s)
    if job is None or job.tenant != tenant:  # another tenant's job does not exist for you
        return _problem(404, "not_found", "no such transcription job (it may have expired)")
    return job


async def get_transcription(request: Request) -> Response:
    """GET /v1/transcriptions/{id}[?format=json|txt|srt|vtt] — status, progress, result."""
    job = await _job(request)
    if isinstance(job, Response):
        return job
    try:
        fmt = TranscriptFormat(request.query_params.get("format", "json"))
    except ValueError:
        known = ", ".join(f.value for f in TranscriptFormat)
        return _problem(400, "bad_format", f"format must be one of: {known}")
    if fmt is TranscriptFormat.JSON:
        return JSONResponse(job.describe())
    if job.status is not JobStatus.DONE:
        return _problem(
            409, "not_done", f"the job is {job.status.value}; its transcript is not ready",
            {"Retry-After": RETRY_AFTER_S},
        )  # fmt: skip
    return Response(job.render(fmt), media_type=fmt.media_type)


async def delete_transcription(request: Request) -> Response:
    """DELETE /v1/transcriptions/{id} — cancel the job if it runs, drop it and its files
    (another node's job: it is gone for readers now; its node cancels it within
    `job_sync_s`)."""
    job = await _job(request)
    if isinstance(job, Response):
        return job
    state = app_state(request)
    if isinstance(job, Job):
        await state.jobs.cancel(job)
        return Response(status_code=204)
    try:
        await state.store.jobs.request_cancel(job.id)
    except StoreError as exc:
        return _problem(503, "overloaded", f"job store: {exc}", {"Retry-After": RETRY_AFTER_S})
    return Response(status_code=204)
