"""The enrolled-speakers API on a real server (fake recognizer; the real VAD, speaker
model and upload decoder): validation, limits, tenant isolation, delete."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator

import numpy as np
import pytest

from engine.speakers import SpeakerEmbedder, SpeakerEncoder
from session.vad import VadState
from tests.support.appserver import AppServer, serve_app
from tests.support.audiofiles import wav_header
from tests.support.corpus import clip
from tests.support.httpclient import HttpResponse, multipart, request

KEYS = {"acme": "key-of-acme-0123456789abcdef", "globex": "key-of-globex-0123456789abcd"}


def wav(pcm: bytes) -> bytes:
    return wav_header(16_000, len(pcm)) + pcm


def silence(seconds: float) -> bytes:
    return wav(np.zeros(int(seconds * 16_000), "<i2").tobytes())


@pytest.fixture(scope="module")
async def server() -> AsyncIterator[AppServer]:
    async with serve_app(
        api_keys=",".join(f"{t}:{k}" for t, k in KEYS.items()),
        max_enrolled_speakers=2,
        enrol_max_audio_s=12.0,
    ) as app:
        yield app


async def call(
    server: AppServer,
    method: str,
    path: str,
    tenant: str | None,
    form: tuple[str, list[bytes]] | None = None,
) -> HttpResponse:
    headers = {} if tenant is None else {"Authorization": f"Bearer {KEYS[tenant]}"}
    body: list[bytes] = []
    if form is not None:
        headers["Content-Type"], body = form
    return await request(method, server.http_url + path, body=body, headers=headers)


async def enrol(server: AppServer, tenant: str | None, audio: bytes, **fields: str) -> HttpResponse:
    return await call(
        server, "POST", "/v1/speakers", tenant, multipart(audio, "voice.wav", **fields)
    )


async def test_enrol_list_get_delete_per_tenant(server: AppServer) -> None:
    """A tenant enrols a corpus voice and sees it (never its embedding); the other tenant
    neither lists, reads nor deletes it; its owner deletes it."""
    made = await enrol(server, "acme", wav(clip("en_jfk").pcm16()), name="Jack")
    assert made.status == 201, made.body
    speaker = made.json()
    assert speaker["name"] == "Jack" and 3.0 <= speaker["seconds"] <= 11.0
    assert set(speaker) == {"speaker_id", "name", "created_at", "seconds"}
    assert made.headers["location"] == f"/v1/speakers/{speaker['speaker_id']}"
    path = f"/v1/speakers/{speaker['speaker_id']}"
    assert (await call(server, "GET", "/v1/speakers", "acme")).json() == {"speakers": [speaker]}
    assert (await call(server, "GET", path, "acme")).json() == speaker
    assert (await call(server, "GET", "/v1/speakers", "globex")).json() == {"speakers": []}
    for method in ("GET", "DELETE"):
        refused = await call(server, method, path, "globex")
        assert refused.status == 404 and refused.json()["error"]["code"] == "not_found"
    assert (await call(server, "DELETE", path, "acme")).status == 204
    assert (await call(server, "GET", path, "acme")).status == 404
    assert (await call(server, "GET", "/v1/speakers", None)).status == 401


async def test_validation_and_limits(server: AppServer) -> None:
    """Named errors: no key, a bad name, too little speech, too long, a taken name, a full
    book; a refused enrollment keeps nothing."""
    voice = wav(clip("en_ls_2412-153948-0000").pcm16())
    assert (await enrol(server, None, voice, name="Ann")).status == 401

    async def code(audio: bytes, **fields: str) -> tuple[int, str]:
        answer = await enrol(server, "globex", audio, **fields)
        return answer.status, answer.json()["error"]["code"]

    assert await code(voice) == (400, "bad_name")
    assert await code(voice, name="S2") == (400, "bad_name")
    assert await code(voice, name="x" * 65) == (400, "bad_name")
    assert await code(silence(6.0), name="Quiet") == (422, "too_little_speech")
    assert await code(silence(13.0), name="Long") == (422, "audio_too_long")
    assert await code(b"not audio at all" * 64, name="Junk") in {
        (415, "unsupported_format"),
        (422, "invalid_audio"),
    }
    assert (await call(server, "GET", "/v1/speakers", "globex")).json() == {"speakers": []}
    assert (await enrol(server, "globex", voice, name="Ann")).status == 201
    assert await code(voice, name="ann") == (409, "speaker_exists")
    assert (await enrol(server, "globex", voice, name="Bea")).status == 201
    assert await code(voice, name="Cid") == (409, "speakers_full")
    listed = (await call(server, "GET", "/v1/speakers", "globex")).json()["speakers"]
    assert [s["name"] for s in listed] == ["Ann", "Bea"]


def lj(seconds: float) -> bytes:
    """`seconds` of one reader's long-form recording, as a WAV."""
    return wav(clip("en_lj_longform_LJ001-0001_0020").pcm16()[: round(seconds * 16_000) * 2])


async def test_enrollments_past_their_turns_are_overloaded() -> None:
    """One turn, no place to wait: an enrollment that comes while another one's upload is
    still arriving is answered 503 `overloaded` with Retry-After (nothing written for it);
    the first then completes."""
    async with serve_app(
        api_keys=",".join(f"{t}:{k}" for t, k in KEYS.items()), enrol_concurrency=1, enrol_queue=0
    ) as app:
        content_type, pieces = multipart(lj(8.0), "voice.wav", name="Held")
        release = asyncio.Event()

        async def slowly() -> AsyncIterator[bytes]:
            yield pieces[0]
            await release.wait()
            for piece in pieces[1:]:
                yield piece

        headers = {"Authorization": f"Bearer {KEYS['acme']}", "Content-Type": content_type}
        first = asyncio.create_task(
            request(
                "POST", app.http_url + "/v1/speakers", body=slowly(), headers=headers, chunked=True
            )
        )
        async with asyncio.timeout(30):
            while app.state.enrollments.held == 0:  # noqa: ASYNC110 - the first is in its turn
                await asyncio.sleep(0.01)
        refused = await enrol(app, "acme", lj(8.0), name="Second")
        assert refused.status == 503, refused.body
        assert refused.json()["error"]["code"] == "overloaded"
        assert refused.headers.get("retry-after")
        release.set()
        made = await first
        assert made.status == 201, made.body
        assert app.state.enrollments.held == 0


async def test_a_full_speaker_embedder_answers_overloaded(server: AppServer) -> None:
    """An enrollment that meets a full embedder queue (the live streams' labels come first)
    is answered 503 `overloaded`, never a 500."""
    services = server.state.services
    assert services is not None
    tight = SpeakerEmbedder(SpeakerEncoder(), max_pending_windows=2)  # < 8 s of speech
    server.state.services = dataclasses.replace(services, speakers=tight)
    try:
        answer = await enrol(server, "acme", lj(11.5), name="Crowded")
    finally:
        server.state.services = services
        await tight.close()
    assert answer.status == 503, answer.body
    assert answer.json()["error"]["code"] == "overloaded"
    assert tight.stats.rejected == 1


async def test_an_enrollment_scores_its_speech_off_the_event_loop(server: AppServer) -> None:
    """While an 11.5 s recording is enrolled, the event loop is never held for as long as its
    VAD scoring takes (~360 model calls): it runs on a worker thread."""
    stalls: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.002)
            now = time.perf_counter()
            stalls.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    cpu = time.thread_time()
    answer = await enrol(server, "acme", lj(11.5), name="Eleven")
    done.set()
    await ticker
    assert answer.status == 201, answer.body
    vad = time.perf_counter()
    scorer = server.state.file_vad
    assert scorer is not None
    windows = np.zeros((23 * 8_000 // 512, 512), np.float32)
    await scorer.score(VadState(), windows)
    vad = time.perf_counter() - vad  # what the loop would have been held for
    assert max(stalls) < vad / 2, (max(stalls), vad, time.thread_time() - cpu)
    await call(server, "DELETE", f"/v1/speakers/{answer.json()['speaker_id']}", "acme")
