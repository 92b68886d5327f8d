"""HTTP routes for enrolled speakers (docs/protocol.md#enrolled-speakers).

- `POST /v1/speakers` — multipart form: `name` and `file` (a few seconds of one voice, any
  format the upload decoder takes). The file is decoded in the sandbox like an upload,
  its speech found by the VAD, and its speaker embedding kept in the store under the
  caller's tenant; the audio is dropped. 201 with the speaker (id, name, seconds).
- `GET /v1/speakers` — the tenant's speakers; `GET /v1/speakers/{id}` one of them.
- `DELETE /v1/speakers/{id}` — forget one (204).

A tenant sees only its own speakers: another's id answers 404. Diarized streams and
uploads of the tenant (`diarize=true`) name the voices that match one (session/enrolled.py).
"""

from __future__ import annotations

import asyncio
import re
import secrets
import shutil
import tempfile
import time
import unicodedata
from pathlib import Path

import numpy as np
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from engine.api import SAMPLE_RATE
from server.auth.access import client_host
from server.auth.keys import bearer
from server.http.rest import refusal
from server.state import AppState, app_state
from server.uploads.decode_worker import Refusal
from server.uploads.form import FORM_OVERHEAD, receive_form, too_large
from session.vad import WINDOW, VadState
from store.enrolled import EnrolledSpeaker, SpeakerBookFull, SpeakerNameTaken
from store.errors import StoreError
from wire.errors import ProtocolError

MAX_NAME = 64
SPEECH = 0.5  # VAD probability from which a window is speech
_ID = re.compile(r"spk_[0-9a-f]{16}")
_S_LABEL = re.compile(r"[Ss]\d+")  # diarization's own labels: no name may look like one


def _problem(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def check_name(raw: str | None) -> str:
    """A display name: 1-64 printable characters, trimmed, not an S-label. Raises Refusal."""
    name = unicodedata.normalize("NFC", (raw or "").strip())
    if not name:
        raise Refusal(400, "bad_name", "name is required")
    if len(name) > MAX_NAME:
        raise Refusal(400, "bad_name", f"name is longer than {MAX_NAME} characters")
    if any(unicodedata.category(c).startswith("C") for c in name):
        raise Refusal(400, "bad_name", "name holds control characters")
    if _S_LABEL.fullmatch(name):
        raise Refusal(400, "bad_name", "names like S1, S2 are diarization's own labels")
    return name


def _tenant(request: Request) -> str | None:
    """The API key's tenant (None while authentication is off). Raises ProtocolError:
    `protected_mode` (403) for a client protected mode keeps out, else 401."""
    auth = app_state(request).auth
    auth.admit(client_host(request))
    return auth.key_principal(bearer(request.headers.get("authorization"))).tenant


async def create_speaker(request: Request) -> Response:
    """POST /v1/speakers — enrol a named voice from a short recording."""
    state = app_state(request)
    group = state.settings.speakers
    try:
        tenant = _tenant(request)
    except ProtocolError as exc:
        return refusal(exc)
    services = state.services
    if services is None or services.speakers is None or state.file_vad is None:
        reason = state.unavailable() or (services.speakers_off if services else "not ready")
        return _problem(503, "overloaded", reason)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > group.enrol_max_bytes + FORM_OVERHEAD:
        refused = too_large(group.enrol_max_bytes)
        return _problem(refused.status, refused.code, refused.message)
    workdir = Path(tempfile.mkdtemp(prefix="parley-enrol-", dir=state.jobs.root))
    try:
        form = await receive_form(
            request.stream(),
            request.headers.get("content-type", ""),
            workdir / "upload",
            max_file_bytes=group.enrol_max_bytes,
            fields={"name"},
            idle_timeout_s=state.settings.uploads.upload_idle_timeout_s,
            receive_timeout_s=60.0,
        )
        name = check_name(form.fields.get("name"))
        decoded = await state.jobs.decode_other(
            form.path, workdir / "audio.s16", group.enrol_max_audio_s
        )
        audio = await asyncio.to_thread(_read_pcm, decoded.path)
        embedding, speech_s = await _voice(state, audio)
        if speech_s < group.enrol_min_speech_s:
            raise Refusal(
                422,
                "too_little_speech",
                f"the recording holds {speech_s:.1f} s of speech; enrolling takes at least "
                f"{group.enrol_min_speech_s:g} s",
            )
        speaker = EnrolledSpeaker(
            speaker_id=f"spk_{secrets.token_hex(8)}",
            name=name,
            created_at=round(time.time(), 3),
            seconds=round(speech_s, 2),
            embedding=embedding.astype("<f4").tobytes(),
        )
        await state.store.speakers.add(tenant, speaker, group.max_enrolled_speakers)
    except Refusal as exc:
        return _problem(exc.status, exc.code, exc.message)
    except SpeakerBookFull:
        limit = group.max_enrolled_speakers
        return _problem(409, "speakers_full", f"the tenant has {limit} speakers (the limit)")
    except SpeakerNameTaken:
        return _problem(409, "speaker_exists", f"a speaker named {name!r} is enrolled already")
    except StoreError as exc:
        return _problem(503, "overloaded", f"speaker store: {exc}")
    except ClientDisconnect:
        return Response(status_code=400)
    finally:
        await asyncio.to_thread(shutil.rmtree, workdir, True)
    return JSONResponse(
        speaker.public(),
        status_code=201,
        headers={"Location": f"/v1/speakers/{speaker.speaker_id}"},
    )


def _read_pcm(path: Path) -> np.ndarray:
    return (np.fromfile(path, dtype="<i2").astype(np.float32) / 32768.0).astype(np.float32)


async def _voice(state: AppState, audio: np.ndarray) -> tuple[np.ndarray, float]:
    """The unit embedding of the recording's speech, and how many seconds of speech it is."""
    assert state.file_vad is not None and state.services is not None
    assert state.services.speakers is not None
    count = len(audio) // WINDOW
    if count == 0:
        return np.zeros(0, np.float32), 0.0
    windows = audio[: count * WINDOW].reshape(count, WINDOW)
    probabilities = await state.file_vad.score(VadState(), windows)
    speech = windows[probabilities >= SPEECH].reshape(-1)
    seconds = len(speech) / SAMPLE_RATE
    if seconds == 0:
        return np.zeros(0, np.float32), 0.0
    embedded = await state.services.speakers.embed(speech)
    if len(embedded.bounds) == 0:
        return np.zeros(0, np.float32), 0.0
    weights = np.array([e - s for s, e in embedded.bounds], np.float64)
    mean = weights @ embedded.embeddings.astype(np.float64)
    return (mean / max(float(np.linalg.norm(mean)), 1e-12)).astype(np.float32), seconds


async def list_speakers(request: Request) -> Response:
    """GET /v1/speakers — the tenant's enrolled speakers, oldest first."""
    try:
        tenant = _tenant(request)
        speakers = await app_state(request).store.speakers.list(tenant)
    except ProtocolError as exc:
        return refusal(exc)
    except StoreError as exc:
        return _problem(503, "overloaded", f"speaker store: {exc}")
    return JSONResponse({"speakers": [s.public() for s in speakers]})


async def get_speaker(request: Request) -> Response:
    """GET /v1/speakers/{id} — one enrolled speaker of the tenant."""
    speaker_id = request.path_params["speaker_id"]
    try:
        tenant = _tenant(request)
        found = None
        if _ID.fullmatch(speaker_id):
            found = await app_state(request).store.speakers.get(tenant, speaker_id)
    except ProtocolError as exc:
        return refusal(exc)
    except StoreError as exc:
        return _problem(503, "overloaded", f"speaker store: {exc}")
    if found is None:
        return _problem(404, "not_found", "no such speaker")
    return JSONResponse(found.public())


async def delete_speaker(request: Request) -> Response:
    """DELETE /v1/speakers/{id} — forget one enrolled speaker of the tenant."""
    speaker_id = request.path_params["speaker_id"]
    try:
        tenant = _tenant(request)
        deleted = False
        if _ID.fullmatch(speaker_id):
            deleted = await app_state(request).store.speakers.delete(tenant, speaker_id)
    except ProtocolError as exc:
        return refusal(exc)
    except StoreError as exc:
        return _problem(503, "overloaded", f"speaker store: {exc}")
    if not deleted:
        return _problem(404, "not_found", "no such speaker")
    return Response(status_code=204)
