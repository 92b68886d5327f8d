"""End to end: uploaded recordings through a real server and the real model."""

from __future__ import annotations

import asyncio
import re
import statistics
from typing import Any

import numpy as np
import pytest

from loadgen.wer import error_rate
from tests.e2e.test_stream_e2e import parse_srt
from tests.support import audiofiles
from tests.support.corpus import clip
from tests.support.httpclient import endless_file, get, post_form, upload
from tests.support.servers import ServerProcess, start_server
from tests.support.wsclient import BYTES_PER_SECOND, stream_pcm

pytestmark = pytest.mark.slow

SPEECH = ["en_jfk", "en_ls_2412-153948-0000"]  # 11 s + 11.7 s, several utterances


def speech() -> tuple[np.ndarray, str]:
    """Two corpus clips with a second of silence between them, and their reference."""
    gap = np.zeros(16_000, np.float32)
    samples = np.concatenate([clip(SPEECH[0]).samples(), gap, clip(SPEECH[1]).samples()])
    return samples, " ".join(clip(c).reference for c in SPEECH)


@pytest.fixture(scope="module")
def recordings() -> dict[str, bytes]:
    """The speech in each accepted format, encoded with PyAV at set-up."""
    samples, _ = speech()
    return {name: audiofiles.encode(samples, name) for name in audiofiles.FORMATS}


def parse_vtt(text: str) -> list[tuple[float, float, str]]:
    assert text.startswith("WEBVTT\n\n"), text[:20]
    cues = []
    for block in text[len("WEBVTT\n\n") :].strip().split("\n\n"):
        timing, *lines = block.split("\n")
        m = re.fullmatch(r"(\d\d):(\d\d):(\d\d)\.(\d{3}) --> (\d\d):(\d\d):(\d\d)\.(\d{3})", timing)
        assert m, timing
        v = [int(x) for x in m.groups()]
        start = v[0] * 3600 + v[1] * 60 + v[2] + v[3] / 1000
        end = v[4] * 3600 + v[5] * 60 + v[6] + v[7] / 1000
        assert end > start
        cues.append((start, end, " ".join(lines)))
    return cues


@pytest.mark.parametrize("name", list(audiofiles.FORMATS))
async def test_each_format_transcribes_correctly(
    parley_server: ServerProcess, recordings: dict[str, bytes], name: str
) -> None:
    """wav, mp3, m4a, flac and ogg/opus uploads transcribe to WER ≤ 0.15; the job's SRT
    and VTT parse and agree with its JSON utterances."""
    _, reference = speech()
    response = await upload(parley_server.http_url, recordings[name], f"speech.{name}",
                            params={"wait": "true"})  # fmt: skip
    assert response.status == 200, response.body
    job = response.json()
    assert job["status"] == "done" and job["file"]["name"] == f"speech.{name}"
    utterances = job["result"]["utterances"]
    text = " ".join(u["text"] for u in utterances)
    wer = error_rate(reference, text)
    print(f"\n{name}: WER {wer:.3f}, {job['duration']:.1f} s audio, timing {job['timing']}")
    assert wer <= 0.15, text
    assert len(utterances) >= 2
    location = response.headers["content-location"]
    srt = await get(f"{parley_server.http_url}{location}?format=srt")
    cues = parse_srt(srt.text)
    # Each utterance is one cue or, past 42 characters or 7 s, several cut between words.
    assert " ".join(c[2] for c in cues) == text
    assert {u["start"] for u in utterances} <= {c[0] for c in cues}
    assert all(u["words"] for u in utterances)
    vtt = await get(f"{parley_server.http_url}{location}?format=vtt")
    assert [c[2] for c in parse_vtt(vtt.text)] == [c[2] for c in cues]


async def test_upload_beside_two_live_rooms(parley_server: ServerProcess) -> None:
    """A long upload runs while two live rooms stream in real time: the rooms' finals stay
    complete and correct, the file is transcribed too; latencies are printed."""
    base = parley_server.http_url
    long_clip = clip("en_lj_longform_LJ001-0001_0020")  # 137 s
    recording = audiofiles.encode(long_clip.samples(), "mp3")
    rooms = ["en_ls_1221-135766-0001", "en_ls_2412-153948-0000"]
    pcm = [clip(c).pcm16() + bytes(BYTES_PER_SECOND) for c in rooms]

    async def upload_and_wait() -> dict[str, Any]:
        response = await upload(base, recording, "longform.mp3")
        assert response.status == 202, response.body
        location = response.headers["location"]
        while True:  # a client polls the job resource
            job = (await get(base + location)).json()
            if job["status"] in {"done", "failed"}:
                return dict(job)
            await asyncio.sleep(0.5)

    file_task = asyncio.create_task(upload_and_wait())
    await asyncio.sleep(1.0)  # the upload is decoded and running when the rooms start
    live = await asyncio.gather(
        *(stream_pcm(parley_server.ws_url, f"e2e-beside-upload-{i}", p, participant=f"p{i}")
          for i, p in enumerate(pcm))
    )  # fmt: skip
    job = await file_task

    server_total: list[float] = []
    client: list[float] = []
    for clip_id, result in zip(rooms, live, strict=True):
        kinds = [m["type"] for m in result.messages]
        assert kinds[0] == "session.started" and kinds[-1] == "session.ended", kinds[-4:]
        ended = result.messages[-1]
        assert ended["finals"] == len(result.finals) > 0
        text = result.text
        assert error_rate(clip(clip_id).reference, text) <= 0.2, text
        server_total += [f["timing"]["total"] for f in result.finals]
        client += result.final_latencies
    assert job["status"] == "done", job
    file_text = job["result"]["text"]
    file_wer = error_rate(long_clip.reference, file_text)
    print(
        f"\nlive finals beside a {job['duration']:.0f} s upload: {len(client)} finals; "
        f"server timing.total median {statistics.median(server_total):.3f} s, "
        f"max {max(server_total):.3f} s; client latency median {statistics.median(client):.3f} s, "
        f"max {max(client):.3f} s\nupload: {job['timing']}, WER {file_wer:.3f}"
    )
    assert file_wer <= 0.2


async def test_hostile_uploads_on_the_real_server(parley_server: ServerProcess) -> None:
    """Playlists, an image, noise named .mp3, a truncated file and a tiny file that
    declares hours of silence each get their documented status; /healthz answers after."""
    samples, _ = speech()
    m4a = audiofiles.encode(samples, "m4a")
    cases: list[tuple[str, bytes, int, str]] = [
        ("list.ffconcat", audiofiles.ffconcat(), 415, "unsupported_format"),
        ("list.m3u8", audiofiles.m3u8(), 415, "unsupported_format"),
        ("list.m3u", b"/etc/hostname\nhttp://127.0.0.1:9/a.mp3\n", 415, "unsupported_format"),
        ("cover.png", audiofiles.png(), 415, "unsupported_format"),
        ("noise.mp3", audiofiles.random_bytes(100_000), 415, "unsupported_format"),
        ("cut.m4a", m4a[: len(m4a) // 2], 422, "invalid_audio"),
        ("silence.wav", audiofiles.one_hertz_wav(5 * 3600), 422, "audio_too_long"),
    ]
    for name, data, status, code in cases:
        response = await upload(parley_server.http_url, data, name, chunked=True)
        assert response.status == status, (name, response.body)
        error = response.json()["error"]
        assert error["code"] == code and error["message"], (name, error)
        print(f"\n{name}: {status} {error['message']}")
        assert parley_server.get("/healthz")[0] == 200


async def test_upload_limits_on_a_small_server() -> None:
    """A server with a 1 MB upload limit and a 30 s duration cap: a 256 MB upload (sent
    chunked, no Content-Length) gets 413 long before it is all sent, a 40 s file of unknown
    length is stopped by the counted duration cap (422); /healthz answers after."""
    server = await asyncio.to_thread(
        start_server, {"PARLEY_MAX_UPLOAD_BYTES": "1000000", "PARLEY_MAX_UPLOAD_SECONDS": "30"}
    )
    try:
        content_type, body = endless_file(256 << 20)
        big = await post_form(server.http_url, content_type, body, chunked=True)
        assert big.status == 413, big.body
        assert big.json()["error"]["code"] == "upload_too_large"
        assert big.sent_bytes < 32 << 20  # cut off early (the rest sat in socket buffers)
        assert server.get("/healthz")[0] == 200
        long = await upload(server.http_url, audiofiles.unknown_length_wav(8000, 40), "long.wav")
        assert long.status == 422 and long.json()["error"]["code"] == "audio_too_long", long.body
        assert "decodes to more than 30 s" in long.json()["error"]["message"]
        assert server.get("/healthz")[0] == 200
    finally:
        server.stop()
