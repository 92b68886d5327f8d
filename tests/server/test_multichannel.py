"""Multichannel on the real app (fake engine, real VAD): protocol v1 `channels=N`,
Deepgram's `multichannel=true` through its SDK and the mixdown without it, and stereo
uploads: one source per channel, everything tagged with its channel, one close; and what
is refused."""

from __future__ import annotations

import asyncio
import io
import wave
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import orjson
import pytest
from websockets.asyncio.client import connect

from tests.support.appserver import AppServer, serve_app
from tests.support.compat_clients import (
    WEBSOCKETS_LEGACY,
    Received,
    deepgram_client,
    drain,
    receive_deepgram,
)
from tests.support.corpus import clip
from tests.support.httpclient import upload

pytestmark = WEBSOCKETS_LEGACY

SECONDS = 3


@pytest.fixture(scope="module")
async def server() -> AsyncIterator[AppServer]:
    async with serve_app(max_channels=4) as app:
        yield app


def speech(clip_id: str = "en_jfk") -> np.ndarray:
    return np.frombuffer(clip(clip_id).pcm16()[: 16_000 * 2 * SECONDS], "<i2")


def stereo(left: np.ndarray, right: np.ndarray) -> bytes:
    return np.stack([left, right], axis=1).astype("<i2").tobytes()


async def stream(server: AppServer, path: str, audio: bytes, frame: int = 6400) -> list[Any]:
    async with connect(server.ws_url + path, max_size=None) as ws:
        for offset in range(0, len(audio), frame):
            await ws.send(audio[offset : offset + frame])
        await ws.send('{"type": "stop"}')
        messages = await drain(ws)
    assert ws.close_code == 1000, messages
    return messages


async def test_v1_two_channels_are_two_participants_of_the_meeting(server: AppServer) -> None:
    """channels=2&participant=ana,bo: speech on channel 0 only makes finals of `ana`,
    channel 0; each channel has its own session.started and session.ended; the meeting's
    transcript holds ana's finals."""
    silence = np.zeros(16_000 * SECONDS, "<i2")
    messages = await stream(
        server,
        "/v1/meetings/mc-v1/stream?channels=2&participant=ana,bo&interim_results=false",
        stereo(speech(), silence),
    )
    started = [m for m in messages if m["type"] == "session.started"]
    assert sorted((m["channel"], m["participant"]) for m in started) == [(0, "ana"), (1, "bo")]
    finals = [m for m in messages if m["type"] == "transcript.final"]
    assert finals and {(m["channel"], m["participant"]) for m in finals} == {(0, "ana")}
    ended = [m for m in messages if m["type"] == "session.ended"]
    assert sorted(m["channel"] for m in ended) == [0, 1]
    assert all(m["audio_seconds"] == SECONDS for m in ended)
    status, _, body = await server.request("GET", "/v1/meetings/mc-v1/transcript")
    assert status == 200
    assert {f["participant"] for f in orjson.loads(body)["finals"]} == {"ana"}


async def test_v1_channels_are_numbered_after_one_participant(server: AppServer) -> None:
    """channels=2 with one name: the channels are `name-0` and `name-1`, each with its own
    finals (speech on both)."""
    messages = await stream(
        server,
        "/v1/meetings/mc-v1-numbered/stream?channels=2&participant=desk&interim_results=false",
        stereo(speech(), speech("en_ls_1089-134686-0001")),
    )
    finals = [m for m in messages if m["type"] == "transcript.final"]
    assert {(m["channel"], m["participant"]) for m in finals} == {(0, "desk-0"), (1, "desk-1")}


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("channels=5", "channels"),  # past max_channels=4
        ("channels=0", "channels"),
        ("channels=two", "channels"),
        ("channels=2&participant=a,b,c", "participant"),
        ("channels=2&participant=a,a", "participant"),
        ("channels=2&resume_token=abc", "resume"),
    ],
)
async def test_v1_refuses_bad_channel_parameters_with_4400(
    server: AppServer, query: str, reason: str
) -> None:
    """Too many channels, participants that do not fit, or a resume of a multichannel
    stream: an error naming why, then close 4400."""
    async with connect(f"{server.ws_url}/v1/meetings/mc-bad/stream?{query}") as ws:
        messages = await drain(ws)
    assert ws.close_code == 4400
    assert messages[-1]["code"] == "bad_config" and reason in messages[-1]["message"]


async def test_v1_partial_sample_frames_close_1007_on_every_channel(server: AppServer) -> None:
    """A frame that is not whole stereo samples: each channel says invalid_audio, then one
    close 1007."""
    async with connect(f"{server.ws_url}/v1/meetings/mc-odd/stream?channels=2") as ws:
        await ws.send(stereo(speech(), speech())[:6400])
        await ws.send(bytes(6))
        messages = await drain(ws)
    assert ws.close_code == 1007
    errors = [m for m in messages if m["type"] == "error"]
    assert sorted(m["channel"] for m in errors) == [0, 1]
    assert {m["code"] for m in errors} == {"invalid_audio"}


async def test_v1_an_error_on_one_channel_stops_the_others(server: AppServer) -> None:
    """pcm_f32le with a NaN on channel 1 only: channel 1 says invalid_audio, channel 0 is
    stopped (its finals, then its session.ended), and the socket closes once, 1007."""
    left = speech().astype("<f4") / 32768
    right = np.zeros_like(left)
    right[-100] = np.nan
    audio = np.stack([left, right], axis=1).astype("<f4").tobytes()
    async with connect(
        f"{server.ws_url}/v1/meetings/mc-nan/stream?channels=2&encoding=pcm_f32le",
        max_size=None,
    ) as ws:
        for offset in range(0, len(audio), 12_800):
            await ws.send(audio[offset : offset + 12_800])
        messages = await drain(ws)
    assert ws.close_code == 1007
    [error] = [m for m in messages if m["type"] == "error"]
    assert error["channel"] == 1 and error["code"] == "invalid_audio"
    assert [m["channel"] for m in messages if m["type"] == "session.ended"] == [0]
    assert {m["channel"] for m in messages if m["type"] == "transcript.final"} == {0}


async def test_v1_a_channel_refused_refuses_the_whole_stream() -> None:
    """With room for one stream, channels=2 is refused whole: overloaded, close 1013, and
    a mono stream is served afterwards (nothing was left admitted)."""
    async with serve_app(max_sessions=1) as app:
        async with connect(f"{app.ws_url}/v1/meetings/mc-full/stream?channels=2") as ws:
            messages = await drain(ws)
        assert ws.close_code == 1013 and messages[-1]["code"] == "overloaded"
        assert "channel" not in messages[-1]
        assert len(app.state.registry) == 0
        async with connect(f"{app.ws_url}/v1/meetings/mc-full/stream") as ws:
            await ws.send('{"type": "stop"}')
            messages = await drain(ws)
        assert ws.close_code == 1000 and messages[-1]["type"] == "session.ended"


async def test_v1_each_channel_resumes_as_a_mono_stream(server: AppServer) -> None:
    """After a dropped channels=2 stream, channel 1's source resumes as a mono stream with
    channel 1's resume_token: the same session, its participant, its finals replayed."""
    base = f"{server.ws_url}/v1/meetings/mc-resume/stream"
    async with connect(f"{base}?channels=2&participant=ana,bo&interim_results=false") as ws:
        audio = stereo(speech(), speech("en_ls_1089-134686-0001"))
        for offset in range(0, len(audio), 6400):
            await ws.send(audio[offset : offset + 6400])
        await ws.send('{"type": "stop"}')
        first = await drain(ws)
    [bo] = [m for m in first if m["type"] == "session.started" and m["channel"] == 1]
    finals = [m for m in first if m["type"] == "transcript.final" and m["channel"] == 1]
    assert finals
    async with connect(f"{base}?resume_token={bo['resume_token']}&last_seq=0") as ws:
        started = orjson.loads(await ws.recv())
        replayed = [orjson.loads(await ws.recv()) for _ in finals]
        await ws.send('{"type": "stop"}')
        await drain(ws)
    assert started["resumed"] and started["session_id"] == bo["session_id"]
    assert started["participant"] == "bo" and "channel" not in started
    assert [m["text"] for m in replayed] == [m["text"] for m in finals]


async def test_deepgram_sdk_multichannel_results_carry_channel_index(server: AppServer) -> None:
    """The SDK with channels=2&multichannel=true: final Results for each channel with
    channel_index [c, 2], and one Metadata (channels 2) after both, then close 1000."""
    client = deepgram_client(server.http_url, server.ws_url)
    audio = stereo(speech(), speech("en_ls_1089-134686-0001"))
    async with client.listen.v1.connect(
        model="nova-3", encoding="linear16", sample_rate=16000, channels=2, multichannel="true"
    ) as connection:
        received = Received()
        reader = asyncio.create_task(receive_deepgram(connection, received))
        for offset in range(0, len(audio), 6400):
            await connection.send_media(audio[offset : offset + 6400])
        await connection.send_close_stream()
        await asyncio.wait_for(reader, 30)
    assert received.close_code == 1000
    finals = [m for m in received.of_type("Results") if m.is_final]
    assert {tuple(m.channel_index) for m in finals} == {(0, 2), (1, 2)}
    [metadata] = received.of_type("Metadata")
    assert received.messages[-1] is metadata
    assert metadata.channels == 2 and metadata.duration == SECONDS


async def test_deepgram_multichannel_finalize_is_answered_on_every_channel(
    server: AppServer,
) -> None:
    """A Finalize in mid-speech on a 2-channel stream: each channel answers with its own
    from_finalize final Results (channel_index [0, 2] and [1, 2])."""
    client = deepgram_client(server.http_url, server.ws_url)
    audio = stereo(speech(), speech("en_ls_1089-134686-0001"))
    async with client.listen.v1.connect(
        model="nova-3", encoding="linear16", channels=2, multichannel="true"
    ) as connection:
        received = Received()
        reader = asyncio.create_task(receive_deepgram(connection, received))
        await connection.send_media(audio[: 16_000 * 4 * 2])  # 2 s of each
        await connection.send_finalize()

        def answered(r: Received) -> list[Any]:
            return [m for m in r.of_type("Results") if m.from_finalize]

        await received.wait_for(lambda r: len(answered(r)) >= 2, 10)
        await connection.send_close_stream()
        await asyncio.wait_for(reader, 10)
    assert sorted(tuple(m.channel_index) for m in answered(received)) == [(0, 2), (1, 2)]
    assert all(m.is_final and m.channel.alternatives[0].transcript for m in answered(received))
    assert received.messages[-1].type == "Metadata"


async def test_deepgram_channels_without_multichannel_mix_down(server: AppServer) -> None:
    """channels=2 without multichannel: one stream of the mixed-down audio, Results with
    channel_index [0, 1], Metadata channels 2 and the audio's duration."""
    silence = np.zeros(16_000 * SECONDS, "<i2")
    async with connect(
        server.ws_url + "/v1/listen?encoding=linear16&channels=2&multichannel=false"
    ) as ws:
        audio = stereo(speech(), silence)
        for offset in range(0, len(audio), 6400):
            await ws.send(audio[offset : offset + 6400])
        await ws.send('{"type": "CloseStream"}')
        messages = await drain(ws)
    assert ws.close_code == 1000
    finals = [m for m in messages if m["type"] == "Results" and m["is_final"]]
    assert finals and all(m["channel_index"] == [0, 1] for m in finals)
    assert messages[-1]["type"] == "Metadata"
    assert messages[-1]["channels"] == 2 and messages[-1]["duration"] == SECONDS


def stereo_wav(left: np.ndarray, right: np.ndarray) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(2)
        wav.setsampwidth(2)
        wav.setframerate(16_000)
        wav.writeframes(stereo(left, right))
    return out.getvalue()


def mono_wav(samples: np.ndarray) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(16_000)
        wav.writeframes(samples.astype("<i2").tobytes())
    return out.getvalue()


async def transcribe(server: AppServer, data: bytes, **fields: str) -> dict[str, Any]:
    response = await upload(
        server.http_url, data, "call.wav", params={"wait": "true"}, fields=fields
    )
    assert response.status == 200, response.body
    return dict(response.json())


async def test_a_stereo_upload_is_transcribed_per_channel(server: AppServer) -> None:
    """multichannel=true: each channel of a stereo WAV is transcribed as its own file
    would be (the same utterances as a mono upload of that track), each utterance with its
    channel and participant, all in time order; without it the file is mixed down."""
    left = np.frombuffer(clip("en_jfk").pcm16(), "<i2")
    right = np.zeros_like(left)
    other = np.frombuffer(clip("en_ls_1089-134686-0001").pcm16(), "<i2")
    right[16_000 * 2 : 16_000 * 2 + len(other)] = other
    job = await transcribe(
        server, stereo_wav(left, right), multichannel="true", participant="ana,bo"
    )
    assert job["options"]["multichannel"] is True and job["file"]["channels"] == 2
    utterances = job["result"]["utterances"]
    assert {(u["channel"], u["participant"]) for u in utterances} == {(0, "ana"), (1, "bo")}
    assert [u["start"] for u in utterances] == sorted(u["start"] for u in utterances)
    for channel, track in enumerate((left, right)):
        alone = (await transcribe(server, mono_wav(track)))["result"]["utterances"]
        mine = [u for u in utterances if u["channel"] == channel]
        assert [(u["start"], u["end"], u["text"]) for u in mine] == [
            (u["start"], u["end"], u["text"]) for u in alone
        ]
    mixed = (await transcribe(server, stereo_wav(left, right)))["result"]["utterances"]
    assert mixed and all("channel" not in u for u in mixed)


async def test_a_stereo_upload_attached_to_a_meeting_is_two_sources(server: AppServer) -> None:
    """multichannel=true with meeting_id: each channel's finals are logged as its own
    participant of the meeting, with the meeting's gap-free seq."""
    left = np.frombuffer(clip("en_jfk").pcm16(), "<i2")
    right = np.zeros_like(left)
    other = np.frombuffer(clip("en_ls_1089-134686-0001").pcm16(), "<i2")
    right[: len(other)] = other
    job = await transcribe(
        server,
        stereo_wav(left, right),
        multichannel="true",
        participant="ana,bo",
        meeting_id="mc-upload-meeting",
    )
    status, _, body = await server.request("GET", "/v1/meetings/mc-upload-meeting/transcript")
    assert status == 200
    logged = orjson.loads(body)["finals"]
    assert {f["participant"] for f in logged} == {"ana", "bo"}
    assert sorted(f["seq"] for f in logged) == list(range(1, len(logged) + 1))
    assert len(logged) == len(job["result"]["utterances"])


async def test_a_multichannel_upload_refuses_names_that_do_not_fit(server: AppServer) -> None:
    """Three names for a stereo file: 400 bad_config naming the participants."""
    silence = np.zeros(16_000, "<i2")
    response = await upload(
        server.http_url,
        stereo_wav(silence, silence),
        "call.wav",
        fields={"multichannel": "true", "participant": "a,b,c"},
    )
    assert response.status == 400 and b"participant" in response.body
