"""Multichannel end to end on a real server (real model, real speech): JFK on channel 0
and a LibriSpeech clip on channel 1, through deepgram-sdk (`multichannel=true`, and the
mono mixdown without it), protocol v1 `channels=2`, and a stereo upload. Each channel's
finals carry their channel, each channel's WER is at most 0.10, and no words of one
channel turn up in the other."""

from __future__ import annotations

import asyncio
import io
import wave
from collections.abc import Awaitable, Callable

import numpy as np
import orjson
import pytest
from websockets.asyncio.client import connect

from loadgen.wer import error_rate, normalize
from tests.support.compat_clients import (
    WEBSOCKETS_LEGACY,
    Received,
    deepgram_client,
    receive_deepgram,
)
from tests.support.corpus import Clip, clip
from tests.support.httpclient import upload
from tests.support.servers import ServerProcess
from tests.support.wsclient import StreamResult, receive_all, stream_url

pytestmark = [pytest.mark.slow, WEBSOCKETS_LEGACY]

SPEED = 2.0  # × real time
FRAME_S = 0.1
TIMEOUT = 120.0
MAX_WER = 0.10
JFK, OTHER = "en_jfk", "en_ls_2412-153948-0000"


def tracks() -> tuple[Clip, Clip, bytes]:
    """JFK and the LibriSpeech clip, and the two as interleaved stereo PCM16."""
    first, second = clip(JFK), clip(OTHER)
    a, b = (np.frombuffer(c.pcm16(), "<i2") for c in (first, second))
    left, right = np.zeros((2, max(len(a), len(b))), "<i2")
    left[: len(a)], right[: len(b)] = a, b
    return first, second, np.stack([left, right], axis=1).tobytes()


def leaked(text: str, own: Clip, other: Clip) -> set[str]:
    """Words of the other channel's reference (not of this one's) in this channel's text."""
    return (set(normalize(text)) & set(normalize(other.reference))) - set(normalize(own.reference))


def check_channels(texts: dict[int, str], label: str) -> None:
    """Each channel within MAX_WER of its clip, with nothing of the other's."""
    first, second, _ = tracks()
    for channel, (own, other) in enumerate([(first, second), (second, first)]):
        wer = error_rate(own.reference, texts.get(channel, ""))
        print(f"{label} channel {channel} ({own.id}): WER {wer:.3f}")
        assert wer <= MAX_WER, (channel, texts)
        assert not leaked(texts[channel], own, other), (channel, texts)


async def paced(pcm: bytes, frame_bytes: int, send: Callable[[bytes], Awaitable[None]]) -> None:
    for offset in range(0, len(pcm), frame_bytes):
        await send(pcm[offset : offset + frame_bytes])
        await asyncio.sleep(FRAME_S / SPEED)


STEREO_FRAME = int(16_000 * FRAME_S) * 2 * 2


async def test_deepgram_sdk_multichannel_transcribes_each_channel(
    parley_server: ServerProcess,
) -> None:
    """The SDK streams JFK (channel 0) and a LibriSpeech clip (channel 1) with
    channels=2&multichannel=true: final Results of each channel carry channel_index
    [c, 2], each channel's text is within WER 0.10 with no word of the other; one Metadata
    ends the stream (close 1000), and the meeting holds both channels' participants."""
    meeting = "mc-e2e-deepgram"
    *_, pcm = tracks()
    client = deepgram_client(parley_server.http_url, parley_server.ws_url)
    async with client.listen.v1.connect(
        model="nova-3",
        encoding="linear16",
        sample_rate=16000,
        channels=2,
        multichannel="true",
        punctuate="true",
        interim_results="true",
        request_options={
            "additional_query_parameters": {"meeting_id": meeting, "participant": "jfk,reader"}
        },
    ) as connection:
        received = Received()
        reader = asyncio.create_task(receive_deepgram(connection, received))
        await paced(pcm, STEREO_FRAME, connection.send_media)
        await connection.send_close_stream()
        await asyncio.wait_for(reader, TIMEOUT)
    assert received.close_code == 1000
    assert [m.type for m in received.messages].count("Metadata") == 1
    assert received.messages[-1].type == "Metadata" and received.messages[-1].channels == 2
    results = received.of_type("Results")
    assert {tuple(m.channel_index) for m in results} == {(0, 2), (1, 2)}
    texts = {
        c: " ".join(
            m.channel.alternatives[0].transcript
            for m in results
            if m.is_final and tuple(m.channel_index) == (c, 2)
        )
        for c in (0, 1)
    }
    check_channels(texts, "deepgram multichannel")
    status, body = parley_server.get(f"/v1/meetings/{meeting}/transcript")
    assert status == 200
    participants = {f["participant"] for f in orjson.loads(body)["finals"]}
    assert participants == {"jfk", "reader"}


async def test_deepgram_channels_without_multichannel_mix_down(
    parley_server: ServerProcess,
) -> None:
    """channels=2 without multichannel=true: one mono stream of the mixed-down audio (JFK on
    channel 0, silence on channel 1): Results at channel_index [0, 1], JFK within WER 0.10."""
    jfk = np.frombuffer(clip(JFK).pcm16(), "<i2")
    pcm = np.stack([jfk, np.zeros_like(jfk)], axis=1).tobytes()
    client = deepgram_client(parley_server.http_url, parley_server.ws_url)
    async with client.listen.v1.connect(
        model="nova-3", encoding="linear16", sample_rate=16000, channels=2
    ) as connection:
        received = Received()
        reader = asyncio.create_task(receive_deepgram(connection, received))
        await paced(pcm, STEREO_FRAME, connection.send_media)
        await connection.send_close_stream()
        await asyncio.wait_for(reader, TIMEOUT)
    finals = [m for m in received.of_type("Results") if m.is_final]
    assert finals and all(list(m.channel_index) == [0, 1] for m in finals)
    text = " ".join(m.channel.alternatives[0].transcript for m in finals)
    wer = error_rate(clip(JFK).reference, text)
    print(f"deepgram mixdown: WER {wer:.3f}")
    assert wer <= MAX_WER, text
    assert received.messages[-1].type == "Metadata" and received.close_code == 1000


async def test_protocol_v1_two_channels_are_two_participants(
    parley_server: ServerProcess,
) -> None:
    """Our own stream with channels=2&participant=jfk,reader: finals tagged channel 0 and
    1, each its participant's, within WER 0.10, nothing of one in the other; a listener
    of the meeting hears both participants."""
    meeting = "mc-e2e-v1"
    *_, pcm = tracks()
    heard, result = StreamResult(), StreamResult()
    async with connect(f"{parley_server.ws_url}/v1/meetings/{meeting}/events") as listener:
        listening = asyncio.create_task(receive_all(listener, heard))
        url = stream_url(
            parley_server.ws_url,
            meeting,
            channels=2,
            participant="jfk,reader",
            interim_results=False,
        )
        async with connect(url, max_size=None) as ws:
            receiving = asyncio.create_task(receive_all(ws, result))
            await paced(pcm, STEREO_FRAME, ws.send)
            await ws.send('{"type": "stop"}')
            await asyncio.wait_for(receiving, TIMEOUT)
        assert result.close_code == 1000
        await asyncio.wait_for(heard.wait_for(lambda h: len(h.finals) >= len(result.finals)), 30)
        await listener.close()
        await listening
    assert {(m["channel"], m["participant"]) for m in result.finals} == {(0, "jfk"), (1, "reader")}
    texts = {c: " ".join(m["text"] for m in result.finals if m["channel"] == c) for c in (0, 1)}
    check_channels(texts, "protocol v1")
    assert sorted(m["channel"] for m in result.of_type("session.ended")) == [0, 1]
    assert {m["participant"] for m in heard.finals} == {"jfk", "reader"}


async def test_a_stereo_upload_is_transcribed_per_channel(parley_server: ServerProcess) -> None:
    """A stereo WAV uploaded with multichannel=true: utterances tagged channel 0 and 1,
    each channel within WER 0.10 and nothing of one in the other."""
    *_, pcm = tracks()
    wav = io.BytesIO()
    with wave.open(wav, "wb") as out:
        out.setnchannels(2)
        out.setsampwidth(2)
        out.setframerate(16_000)
        out.writeframes(pcm)
    response = await upload(
        parley_server.http_url,
        wav.getvalue(),
        "call.wav",
        params={"wait": "true"},
        fields={"multichannel": "true"},
    )
    assert response.status == 200, response.body
    utterances = response.json()["result"]["utterances"]
    assert {(u["channel"], u["participant"]) for u in utterances} == {
        (0, "speaker-0"),
        (1, "speaker-1"),
    }
    texts = {c: " ".join(u["text"] for u in utterances if u["channel"] == c) for c in (0, 1)}
    check_channels(texts, "upload")
