"""The upload job API on a real in-process server whose only fake is the recognizer."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect

from bench.fake_recognizer import FakeRecognizer
from tests.support import audiofiles
from tests.support.appserver import serve_app
from tests.support.corpus import REPO, clip
from tests.support.httpclient import endless_file, get, multipart, post_form, request, upload
from tests.support.timeouts import S
from tests.support.wsclient import StreamResult, receive_all

TIMEOUT = 30 * S


@pytest.fixture(scope="module")
def jfk() -> dict[str, bytes]:
    """The JFK clip in each accepted format, encoded at set-up."""
    samples = clip("en_jfk").samples()
    return {name: audiofiles.encode(samples, name) for name in audiofiles.FORMATS}


@contextlib.asynccontextmanager
async def serve(
    tmp_path: Path, fake: FakeRecognizer | None = None, **overrides: Any
) -> AsyncIterator[str]:
    """The app in this event loop with a fake recognizer and uploads under `tmp_path`;
    yields its URL."""
    recognizer = fake or FakeRecognizer()
    async with serve_app(
        lambda _: recognizer,
        static_dir=str(REPO / "server" / "static"),
        upload_dir=str(tmp_path / "uploads"),
        max_batch_size=8,
        **overrides,
    ) as server:
        assert (await get(f"{server.http_url}/readyz")).status == 200
        yield server.http_url


async def poll_until_finished(base: str, location: str) -> dict[str, Any]:
    async with asyncio.timeout(TIMEOUT):
        while True:
            job = (await get(base + location)).json()
            if job["status"] in {"done", "failed", "cancelled"}:
                return dict(job)
            await asyncio.sleep(0.05)


def srt_cues(text: str) -> list[tuple[str, str]]:
    blocks = [b.split("\n") for b in text.strip().split("\n\n")]
    for lines in blocks:
        assert lines[0].isdigit()
        assert re.fullmatch(r"\d\d:\d\d:\d\d,\d{3} --> \d\d:\d\d:\d\d,\d{3}", lines[1]), lines
    return [(lines[1], " ".join(lines[2:])) for lines in blocks]


async def test_upload_job_lifecycle(tmp_path: Path, jfk: dict[str, bytes]) -> None:
    """POST → 202 + Location; GET shows progress then the result; formats render;
    DELETE forgets the job; no temp file is left behind."""
    async with serve(tmp_path) as base:
        response = await upload(base, jfk["mp3"], "speech.mp3", chunked=True)
        assert response.status == 202, response.body
        location = response.headers["location"]
        assert re.fullmatch(r"/v1/transcriptions/[0-9a-f]{16}", location)
        accepted = response.json()
        assert accepted["status"] in {"queued", "running", "done"}
        assert accepted["file"]["format"] == "mp3" and accepted["file"]["name"] == "speech.mp3"
        assert abs(accepted["duration"] - 11.0) < 0.1

        job = await poll_until_finished(base, location)
        assert job["status"] == "done", job
        assert job["progress"]["processed_seconds"] == job["progress"]["total_seconds"]
        assert job["progress"]["fraction"] == 1.0
        utterances = job["result"]["utterances"]
        assert len(utterances) >= 2  # JFK pauses between phrases
        assert all(u["text"].startswith("n=") for u in utterances)  # the fake's transcript
        assert all(0 <= u["start"] < u["end"] <= job["duration"] for u in utterances)
        assert all(a["end"] <= b["start"] for a, b in itertools.pairwise(utterances))
        assert job["timing"]["realtime_factor"] > 0

        srt = await get(f"{base}{location}?format=srt")
        assert srt.status == 200 and srt.headers["content-type"].startswith("application/x-subrip")
        assert [text for _, text in srt_cues(srt.text)] == [u["text"] for u in utterances]
        vtt = await get(f"{base}{location}?format=vtt")
        assert vtt.text.startswith("WEBVTT\n\n") and "<v " not in vtt.text
        txt = await get(f"{base}{location}?format=txt")
        assert txt.text.count("\n") == len(utterances)
        assert (await get(f"{base}{location}?format=docx")).status == 400

        deleted = await request("DELETE", base + location)
        assert deleted.status == 204
        assert (await get(base + location)).status == 404
    assert list((tmp_path / "uploads").iterdir()) == []


async def test_wait_true_answers_with_the_transcript(tmp_path: Path, jfk: dict[str, bytes]) -> None:
    """`wait=true` returns 200 with the transcript in the requested format, labelled with
    the participant when one is given."""
    async with serve(tmp_path) as base:
        response = await upload(
            base,
            jfk["flac"],
            "a.flac",
            params={"wait": "true"},
            fields={"format": "srt", "participant": "ana"},
        )
        assert response.status == 200, response.body
        assert response.headers["content-location"].startswith("/v1/transcriptions/")
        cues = srt_cues(response.text)
        assert cues and all(text.startswith("ana: n=") for _, text in cues)


async def test_meeting_id_attaches_finals_to_the_meeting(
    tmp_path: Path, jfk: dict[str, bytes]
) -> None:
    """With `meeting_id` the file's finals join the meeting's log (gap-free seq, after
    what was there) and reach the meeting's listeners."""
    async with serve(tmp_path) as base:
        ws = base.replace("http", "ws")
        heard = StreamResult()
        async with connect(f"{ws}/v1/meetings/standup/events") as listener:
            receiver = asyncio.create_task(receive_all(listener, heard))
            wait = {"wait": "true"}
            first = await upload(
                base,
                jfk["wav"],
                params=wait,
                fields={"meeting_id": "standup", "participant": "rec"},
            )
            second = await upload(
                base,
                jfk["ogg"],
                params=wait,
                fields={"meeting_id": "standup", "participant": "bot"},
            )
            assert first.status == 200 and second.status == 200
            logged = sum(len(r.json()["result"]["utterances"]) for r in (first, second))
            async with asyncio.timeout(TIMEOUT):  # published as logged: however late
                await heard.wait_for(lambda r: len(r.finals) >= logged)
            await asyncio.sleep(0.2)  # room for a final too many, which would be a fault
            await listener.close()
            await receiver
        n_first = len(first.json()["result"]["utterances"])
        transcript = (await get(f"{base}/v1/meetings/standup/transcript")).json()["finals"]
        transcript.sort(key=lambda f: f["seq"])  # it lists them in meeting time
        assert [f["seq"] for f in transcript] == list(range(1, len(transcript) + 1))
        assert [f["participant"] for f in transcript][n_first - 1 : n_first + 1] == [
            "rec",
            "bot",
        ]
        assert [(f["seq"], f["text"]) for f in heard.finals] == [
            (f["seq"], f["text"]) for f in transcript
        ]


async def test_hostile_uploads_get_their_status_and_the_server_stays_up(
    tmp_path: Path, jfk: dict[str, bytes]
) -> None:
    """Over-limit (chunked, no Content-Length) → 413; playlists, images, noise → 415;
    truncated or hours-long → 422; bad options → 400; /healthz answers after each."""
    cases: list[tuple[str, bytes, dict[str, str], int, str]] = [
        ("over the limit", audiofiles.random_bytes(3 << 20), {}, 413, "upload_too_large"),
        ("ffconcat", audiofiles.ffconcat(), {}, 415, "unsupported_format"),
        ("m3u8", audiofiles.m3u8(), {}, 415, "unsupported_format"),
        ("png", audiofiles.png(), {}, 415, "unsupported_format"),
        ("noise.mp3", audiofiles.random_bytes(30_000), {}, 415, "unsupported_format"),
        ("truncated m4a", jfk["m4a"][: len(jfk["m4a"]) // 2], {}, 422, "invalid_audio"),
        ("hours of silence", audiofiles.one_hertz_wav(3 * 3600), {}, 422, "audio_too_long"),
        ("bad format", jfk["wav"], {"format": "docx"}, 400, "bad_format"),
        ("bad meeting", jfk["wav"], {"meeting_id": "no spaces"}, 400, "bad_config"),
        ("unknown language", jfk["wav"], {"language": "fr"}, 400, "bad_config"),
    ]
    async with serve(tmp_path, max_upload_bytes=2 << 20, max_upload_seconds=3600) as base:
        for name, data, fields, status, code in cases:
            response = await upload(base, data, name, chunked=True, fields=fields)
            assert response.status == status, (name, response.body)
            assert response.json()["error"]["code"] == code, name
            assert (await get(f"{base}/healthz")).status == 200
        content_type, body = endless_file(256 << 20)
        big = await post_form(base, content_type, body, chunked=True)
        assert big.status == 413 and big.sent_bytes < 32 << 20  # refused while it streamed
        good = await upload(base, jfk["wav"], params={"wait": "true"})
        assert good.status == 200
    assert list((tmp_path / "uploads").iterdir()) == []


async def test_too_many_jobs_get_503(tmp_path: Path, jfk: dict[str, bytes]) -> None:
    """Past `upload_max_jobs` unfinished jobs a new upload gets 503 with Retry-After; a
    cancelled job frees its slot and its temp files."""
    fake = FakeRecognizer(gated=True)
    async with serve(tmp_path, fake, upload_max_jobs=1) as base:
        first = await upload(base, jfk["wav"])
        assert first.status == 202
        await asyncio.to_thread(fake.entered.wait, TIMEOUT)  # its first batch is running
        second = await upload(base, jfk["wav"])
        assert second.status == 503 and second.headers["retry-after"]
        assert second.json()["error"]["code"] == "overloaded"
        location = first.headers["location"]
        assert (await get(base + location)).json()["status"] == "running"
        assert len(list((tmp_path / "uploads").iterdir())) == 1
        assert (await request("DELETE", base + location)).status == 204
        assert list((tmp_path / "uploads").iterdir()) == []
        fake.release(100)  # let the batch in flight (and any later ones) finish
        third = await upload(base, jfk["wav"], params={"wait": "true"})
        assert third.status == 200


async def test_a_stalled_or_crawling_upload_gives_its_slot_back(
    tmp_path: Path, jfk: dict[str, bytes]
) -> None:
    """An upload whose body stops (nothing for PARLEY_UPLOAD_IDLE_TIMEOUT_S) or crawls
    (not done within PARLEY_UPLOAD_RECEIVE_TIMEOUT_S) is refused 408 `upload_timeout`
    while the client still holds the connection open, and its job slot is free again."""
    content_type, _ = multipart(b"", "slow.wav")
    head = content_type.split("boundary=")[1]
    part = f'--{head}\r\nContent-Disposition: form-data; name="file"; filename="s"\r\n\r\n'

    async def stalled() -> AsyncIterator[bytes]:
        yield part.encode() + b"RIFF"
        await asyncio.Event().wait()  # the client goes silent, its connection stays open

    async def crawling() -> AsyncIterator[bytes]:
        yield part.encode()
        while True:
            yield b"\0" * 16
            await asyncio.sleep(0.1)

    async with serve(
        tmp_path, upload_max_jobs=1, upload_idle_timeout_s=0.5, upload_receive_timeout_s=1.5
    ) as base:
        for body, least in ((stalled(), 0.5), (crawling(), 1.5)):
            started = asyncio.get_running_loop().time()
            refused = await post_form(base, content_type, body, chunked=True, timeout=10)
            took = asyncio.get_running_loop().time() - started
            assert refused.status == 408, refused.body
            assert refused.json()["error"]["code"] == "upload_timeout"
            assert least <= took < least + 3, took
        good = await upload(base, jfk["wav"])
        assert good.status == 202, good.body
