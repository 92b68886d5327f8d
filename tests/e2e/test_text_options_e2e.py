"""End to end: redaction and numerals on real speech (sentences spoken by espeak-ng at
run time, a voice the model was not tuned on), through a real server and the real model:
Deepgram's SDK on `/v1/listen`, our own stream with its listener and stored transcript,
and an upload. What tiny.en writes of them without the options: "My current number is
4,111,111,111,... My social security number is 1,2,3,45, 6,7,8,8,8." and "I have two
brothers and four sisters ... seven open issues and 11 closed ones"."""

from __future__ import annotations

import asyncio
import functools
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect

from tests.e2e.test_compat_e2e import TIMEOUT, paced
from tests.support.audiofiles import wav_header
from tests.support.compat_clients import (
    WEBSOCKETS_LEGACY,
    Received,
    deepgram_client,
    receive_deepgram,
)
from tests.support.httpclient import upload
from tests.support.servers import ServerProcess
from tests.support.wsclient import StreamResult, receive_all, stream_pcm

pytestmark = [
    pytest.mark.slow,
    WEBSOCKETS_LEGACY,
    pytest.mark.skipif(
        not (shutil.which("espeak-ng") and shutil.which("sox")),
        reason="needs espeak-ng and sox (apt-get install espeak-ng sox)",
    ),
]

CARD_AND_SSN = (
    "My card number is 4111 1111 1111 1111. My social security number is one two three, "
    "four five, six seven eight nine. Thank you."
)
COUNTS = "I have two brothers and four sisters. There are seven open issues and eleven closed ones."


@functools.cache
def spoken(text: str) -> bytes:
    """`text` spoken by espeak-ng (en-us, 140 words a minute), as 16 kHz mono PCM16."""
    with tempfile.TemporaryDirectory() as folder:
        voice, wav = Path(folder) / "voice.wav", Path(folder) / "16k.wav"
        subprocess.run(
            ["espeak-ng", "-v", "en-us", "-s", "140", "-w", str(voice), text], check=True
        )
        subprocess.run(
            ["sox", str(voice), "-r", "16000", "-c", "1", "-b", "16", "-e", "signed", str(wav)],
            check=True,
        )
        data = wav.read_bytes()
    return data[data.index(b"data") + 8 :]  # sox writes a plain 44-byte RIFF header


def assert_redacted(text: str) -> None:
    """No digit of the card or the SSN is left; the words around them are."""
    assert not re.search(r"\d", text), text
    lowered = text.lower()
    assert "[pci]" in lowered and "[ssn]" in lowered, text
    assert "social security" in lowered and "thank you" in lowered, text


def final_texts(received: Received) -> list[str]:
    return [
        m.channel.alternatives[0].transcript
        for m in received.of_type("Results")
        if m.is_final and m.channel.alternatives[0].transcript
    ]


async def deepgram_stream(server: ServerProcess, pcm: bytes, **options: Any) -> Received:
    client = deepgram_client(server.http_url, server.ws_url)
    async with client.listen.v1.connect(
        model="nova-3", encoding="linear16", sample_rate=16000, **options
    ) as connection:
        received = Received()
        reader = asyncio.create_task(receive_deepgram(connection, received))
        await paced(pcm, 16_000, connection.send_media)
        await connection.send_close_stream()
        await asyncio.wait_for(reader, TIMEOUT)
    return received


async def test_deepgram_sdk_redacts_a_spoken_card_and_ssn(parley_server: ServerProcess) -> None:
    """redact=pci&redact=ssn through the SDK: no interim or final Results, transcript or
    word, holds a digit of them; [PCI] and [SSN] stand in their place, the words around
    stay; the closing Metadata bills the audio's seconds."""
    pcm = spoken(CARD_AND_SSN)
    received = await deepgram_stream(
        parley_server,
        pcm,
        redact=["pci", "ssn"],
        punctuate="true",
        interim_results="true",
    )
    results = received.of_type("Results")
    assert results
    for result in results:
        alternative = result.channel.alternatives[0]
        assert not re.search(r"\d", alternative.transcript), alternative.transcript
        assert not any(re.search(r"\d", w.word or "") for w in alternative.words or [])
    text = " ".join(final_texts(received))
    print(f"deepgram redact=pci,ssn: {text!r}")
    assert_redacted(text)
    metadata = received.messages[-1]
    assert metadata.type == "Metadata"
    assert metadata.duration == pytest.approx(len(pcm) / 32_000, abs=0.05)


async def test_deepgram_sdk_numerals(parley_server: ServerProcess) -> None:
    """numerals=true through the SDK writes 2, 4, 7 and 11 for the spoken counts (tiny.en
    writes the first three as words), and the final words carry the same numerals."""
    received = await deepgram_stream(parley_server, spoken(COUNTS), numerals="true")
    finals = [m for m in received.of_type("Results") if m.is_final]
    text = " ".join(final_texts(received))
    print(f"deepgram numerals=true: {text!r}")
    assert {"2", "4", "7", "11"} <= set(re.findall(r"\d+", text)), text
    words = [w.word for m in finals for w in m.channel.alternatives[0].words or []]
    assert {"2", "4", "7", "11"} <= set(words), words


async def test_own_stream_redacts_everywhere_it_goes(parley_server: ServerProcess) -> None:
    """Our stream with redact=pci,ssn: its partials, finals and their words, the
    meeting's listener and the stored transcript all hold [PCI] and [SSN] and no digit;
    session.started says the options, session.ended bills the audio's seconds."""
    meeting = "text-options-redact"
    heard = StreamResult()
    pcm = spoken(CARD_AND_SSN)
    async with connect(f"{parley_server.ws_url}/v1/meetings/{meeting}/events") as listener:
        listening = asyncio.create_task(receive_all(listener, heard))
        result = await stream_pcm(
            parley_server.ws_url, meeting, pcm, speed=2.0, redact="pci,ssn", interim_results=True
        )
        await heard.wait_for(lambda h: len(h.finals) >= len(result.finals))
        await listener.close()
        await listening
    started, ended = result.messages[0], result.messages[-1]
    assert started["config"]["redact"] == ["pci", "ssn"]
    assert ended["type"] == "session.ended"
    assert ended["usage"]["audio_seconds"] == pytest.approx(len(pcm) / 32_000, abs=0.01)
    sent = [m for m in result.messages if m["type"].startswith("transcript.")]
    assert any(m["type"] == "transcript.partial" for m in sent)
    for message in [*sent, *heard.messages]:
        assert not re.search(r"\d", orjson.dumps(message.get("text", "")).decode()), message
        assert not any(re.search(r"\d", w["word"]) for w in message.get("words", []))
    text = " ".join(f["text"] for f in result.finals)
    print(f"v1 redact=pci,ssn: {text!r}")
    assert_redacted(text)
    assert [f["text"] for f in heard.finals] == [f["text"] for f in result.finals]
    status, body = parley_server.get(f"/v1/meetings/{meeting}/transcript")
    assert status == 200
    assert [f["text"] for f in orjson.loads(body)["finals"]] == [f["text"] for f in result.finals]


async def test_upload_redacts_and_writes_numerals(parley_server: ServerProcess) -> None:
    """An upload with redact (a form field) and numerals (the query): its text and words
    are redacted, its counts written as digits, its options say so, its usage bills the
    file's seconds."""
    pcm = spoken(CARD_AND_SSN) + bytes(32_000) + spoken(COUNTS)
    header = wav_header(16_000, len(pcm))
    response = await upload(
        parley_server.http_url,
        header + pcm,
        "speech.wav",
        params={"wait": "true", "numerals": "true"},
        fields={"redact": "pci,ssn"},
    )
    assert response.status == 200, response.body
    job = orjson.loads(response.body)
    assert job["options"]["redact"] == ["pci", "ssn"] and job["options"]["numerals"] is True
    result = job["result"]
    text = result["text"]
    print(f"upload redact=pci,ssn numerals=true: {text!r}")
    card_part, _, counts_part = text.partition("Thank you")
    assert_redacted(card_part + "Thank you")
    assert {"2", "4", "7", "11"} <= set(re.findall(r"\d+", counts_part)), text
    words = "".join(w["word"] for u in result["utterances"] for w in u["words"])
    assert "[PCI]" in words and "[SSN]" in words
    assert result["usage"]["audio_seconds"] == pytest.approx(len(pcm) / 32_000, abs=0.01)
