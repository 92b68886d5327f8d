"""Enrolled speakers end to end: the real models on corpus speakers, a real server on
Redis, two tenants. Tenant A enrols two corpus voices (from clips the meeting does not
use); its diarized stream and upload name them; tenant B's stream of the same audio
never gets A's names."""

from __future__ import annotations

import asyncio
import uuid
import wave
from collections.abc import AsyncIterator
from io import BytesIO

import orjson
import pytest

from server.app import whisper_recognizer
from tests.e2e.test_diarization_e2e import TWO, mix, word_accuracy
from tests.support.appserver import AppServer, serve_app
from tests.support.audiofiles import wav_header
from tests.support.corpus import clip
from tests.support.hardclient import STOP, bearer, exchange
from tests.support.httpclient import multipart, request
from tests.support.redis_support import delete_keys
from tests.support.wsclient import StreamResult, stream_pcm

pytestmark = pytest.mark.slow

KEYS = {
    "a": "key-of-tenant-a-0123456789abcdef",
    "b": "key-of-tenant-b-0123456789abcdef",
    "c": "key-of-tenant-c-0123456789abcdef",  # enrols a crowd beside a live stream
}
# Enrollment clips: the same speakers as TWO's, other recordings.
VOICES = {"Linda": "en_lj_LJ001-0005", "Michael": "en_mfa_surround"}


@pytest.fixture(scope="module")
async def server(redis_url: str) -> AsyncIterator[AppServer]:
    prefix = f"parley-test:{uuid.uuid4().hex[:12]}:"
    try:
        async with serve_app(
            whisper_recognizer,
            api_keys=",".join(f"{t}:{k}" for t, k in KEYS.items()),
            fast_replay_tenants="*",
            redis_url=redis_url,
            store_prefix=prefix,
            admit_max_queue_wait_ms=0,
        ) as app:
            for name, clip_id in VOICES.items():
                pcm = clip(clip_id).pcm16()
                content_type, body = multipart(wav_header(16_000, len(pcm)) + pcm, name=name)
                made = await request(
                    "POST",
                    f"{app.http_url}/v1/speakers",
                    body=body,
                    headers={"Content-Type": content_type, **bearer(KEYS["a"])},
                )
                assert made.status == 201, made.body
            yield app
    finally:
        await delete_keys(redis_url, prefix)


async def stream(server: AppServer, tenant: str, meeting: str, pcm: bytes) -> StreamResult:
    frames: list[bytes | str] = [pcm[o : o + 6400] for o in range(0, len(pcm), 6400)]
    url = f"{server.ws_url}/v1/meetings/{meeting}/stream?diarize=true&interim_results=false"
    return await exchange(url, [*frames, STOP], headers=bearer(KEYS[tenant]), timeout=300)


def labels(result: StreamResult) -> dict[str, str]:
    """Each final's label as the stream last said it (finals, then relabels)."""
    told = {str(f["utterance_id"]): str(f["speaker"]) for f in result.finals}
    for m in result.of_type("transcript.speaker"):
        told[str(m["utterance_id"])] = str(m["speaker"])
    return told


async def test_enrolled_names_only_for_their_tenant(server: AppServer) -> None:
    """A's stream names both voices (≥ 90 % of words under the right name, told to the
    stream and kept in the log); B's stream of the same audio shows only S-labels."""
    pcm, turns = mix(TWO)
    named = await stream(server, "a", "enrol-a", pcm)
    assert named.messages[-1]["type"] == "session.ended", named.messages[-3:]
    status, _, body = await server.request(
        "GET", "/v1/meetings/enrol-a/transcript", headers=bearer(KEYS["a"])
    )
    finals = orjson.loads(body)["finals"]
    assert status == 200 and len(finals) >= 6
    assert {f["speaker"] for f in finals} == {"Linda", "Michael"}, finals
    assert labels(named) == {f["utterance_id"]: f["speaker"] for f in finals}
    lj = [t for t in turns if t[0] == "LJ"]
    assert (
        word_accuracy(
            finals,
            [("Linda", *t[1:]) for t in lj] + [("Michael", *t[1:]) for t in turns if t[0] == "mfa"],
        )
        >= 0.9
    )

    other = await stream(server, "b", "enrol-b", pcm)
    assert set(labels(other).values()) == {"S1", "S2"}
    status, _, body = await server.request(
        "GET", "/v1/meetings/enrol-b/transcript", headers=bearer(KEYS["b"])
    )
    assert {f["speaker"] for f in orjson.loads(body)["finals"]} == {"S1", "S2"}


async def test_upload_names_enrolled_voices(server: AppServer) -> None:
    """A diarized upload of tenant A names the enrolled voices too."""
    pcm, _ = mix(TWO[:4])
    buffer = BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16_000)
        out.writeframes(pcm)
    content_type, body = multipart(buffer.getvalue(), "two.wav")
    answer = await request(
        "POST",
        f"{server.http_url}/v1/transcriptions?wait=true&diarize=true",
        body=body,
        headers={"Content-Type": content_type, **bearer(KEYS["a"])},
        timeout=300,
    )
    assert answer.status == 200, answer.body
    utterances = answer.json()["result"]["utterances"]
    assert {u["speaker"] for u in utterances} == {"Linda", "Michael"}


async def test_a_crowd_of_enrollments_beside_a_real_time_stream(server: AppServer) -> None:
    """12 enrollments of 30 s at once, 2 s into a real-time JFK stream: none answers 5xx
    (they take turns: ENROL_CONCURRENCY), and every JFK final arrives within 1.5 s of its
    audio (the enrollments' VAD runs off the event loop)."""
    long = clip("en_lj_longform_LJ001-0001_0020").pcm16()
    second = 16_000 * 2

    async def enrol(i: int) -> tuple[int, bytes]:
        pcm = long[i * 8 * second : (i * 8 + 30) * second]
        content_type, body = multipart(wav_header(16_000, len(pcm)) + pcm, name=f"Crowd {i}")
        answer = await request(
            "POST",
            f"{server.http_url}/v1/speakers",
            body=body,
            headers={"Content-Type": content_type, **bearer(KEYS["c"])},
            timeout=120,
        )
        return answer.status, answer.body

    async def crowd() -> list[tuple[int, bytes]]:
        await asyncio.sleep(2.0)
        return list(await asyncio.gather(*(enrol(i) for i in range(12))))

    jfk = clip("en_jfk").pcm16()
    live, statuses = await asyncio.gather(
        stream_pcm(
            server.ws_url,
            f"crowd-{uuid.uuid4().hex[:8]}",
            jfk,
            speed=1.0,
            interim_results=False,
            trailing_silence=1.0,
            headers=bearer(KEYS["c"]),
        ),
        crowd(),
    )
    try:
        assert all(status < 500 for status, _ in statuses), statuses
        assert [status for status, _ in statuses] == [201] * 12, statuses
        assert live.messages[-1]["type"] == "session.ended", live.messages[-3:]
        assert len(live.finals) >= 3 and "country" in live.text.lower(), live.text
        assert max(live.final_latencies) <= 1.5, live.final_latencies
    finally:
        _, _, body = await server.request("GET", "/v1/speakers", headers=bearer(KEYS["c"]))
        for speaker in orjson.loads(body)["speakers"]:
            await server.request(
                "DELETE", f"/v1/speakers/{speaker['speaker_id']}", headers=bearer(KEYS["c"])
            )
