"""End to end through the vendors' official SDKs: a real server (real model), real speech.

deepgram-sdk on `/v1/listen` and openai on `/v1/realtime`, each as its users would write
it: interim results before finals, final text within WER 0.15, `Finalize` answered with
`from_finalize`, `CloseStream` ending in `Metadata` and close 1000; the Deepgram stream
joins a meeting whose protocol v1 listener and stored transcript see its finals."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
import pytest
from websockets.asyncio.client import connect

from bench.keyterms import TUNING, speak
from loadgen.wer import error_rate
from server.compat.deepgram_text import plain
from tests.support.compat_clients import (
    WEBSOCKETS_LEGACY,
    Received,
    b64,
    deepgram_client,
    drain,
    openai_client,
    pcm16_at,
    receive_deepgram,
    receive_openai,
    transcription_session,
)
from tests.support.corpus import clip
from tests.support.servers import ServerProcess
from tests.support.timeouts import S
from tests.support.wsclient import StreamResult, receive_all

pytestmark = [pytest.mark.slow, WEBSOCKETS_LEGACY]

SPEED = 2.0  # × real time
FRAME_S = 0.1
TIMEOUT = 120 * S


async def paced(pcm: bytes, rate: int, send: Callable[[bytes], Awaitable[None]]) -> None:
    """Send PCM16 at `rate` in 100 ms frames, SPEED × real time."""
    step = int(rate * FRAME_S) * 2
    for offset in range(0, len(pcm), step):
        await send(pcm[offset : offset + step])
        await asyncio.sleep(FRAME_S / SPEED)


async def answered(received: Received, mark: int, timeout: float = TIMEOUT) -> None:
    """Wait for the answer to the `input_audio_buffer.commit` sent when `received` held
    `mark` messages (`committed`, or the `input_audio_buffer_commit_empty` error on
    silence), then for every committed item's transcript: the end of the session's
    work, by its events rather than by a quiet spell."""

    def done(r: Received) -> bool:
        later = r.messages[mark:]
        answer = any(
            m.type == "input_audio_buffer.committed"
            or (m.type == "error" and m.error.code == "input_audio_buffer_commit_empty")
            for m in later
        )
        committed = {m.item_id for m in r.of_type("input_audio_buffer.committed")}
        finished = {
            m.item_id
            for kind in ("completed", "failed")
            for m in r.of_type(f"conversation.item.input_audio_transcription.{kind}")
        }
        return answer and committed <= finished

    await received.wait_for(done, timeout)


def finals(received: Received) -> list[str]:
    return [
        m.channel.alternatives[0].transcript
        for m in received.of_type("Results")
        if m.is_final and m.channel.alternatives[0].transcript
    ]


async def test_deepgram_sdk_stream_joins_a_meeting(parley_server: ServerProcess) -> None:
    """The SDK streams JFK into a meeting: interim Results come before finals, the finals'
    text is within WER 0.15, VAD events and UtteranceEnd come, CloseStream ends in Metadata
    and close 1000, and a protocol v1 listener and the stored transcript hold the same
    finals."""
    meeting = "compat-dg-meeting"
    heard = StreamResult()
    client = deepgram_client(parley_server.http_url, parley_server.ws_url)
    async with connect(f"{parley_server.ws_url}/v1/meetings/{meeting}/events") as listener:
        listening = asyncio.create_task(receive_all(listener, heard))
        async with client.listen.v1.connect(
            model="nova-3",
            encoding="linear16",
            sample_rate=16000,
            interim_results="true",
            punctuate="true",
            vad_events="true",
            utterance_end_ms=1000,
            request_options={
                "additional_query_parameters": {"meeting_id": meeting, "participant": "dg-bot"}
            },
        ) as connection:
            received = Received()
            reader = asyncio.create_task(receive_deepgram(connection, received))
            jfk = clip("en_jfk")
            await paced(jfk.pcm16(), 16_000, connection.send_media)
            await connection.send_close_stream()
            await asyncio.wait_for(reader, TIMEOUT)
        await heard.wait_for(lambda h: len(h.finals) >= len(finals(received)))
        await listener.close()
        await listening
    kinds = [m.type for m in received.messages]
    results = received.of_type("Results")
    first_final = next(i for i, m in enumerate(results) if m.is_final)
    assert any(not m.is_final for m in results[:first_final]), "no interim before the final"
    text = " ".join(finals(received))
    wer = error_rate(jfk.reference, text)
    print(f"deepgram en_jfk: WER {wer:.3f}, {first_final} interim Results before the first final")
    assert wer <= 0.15, text
    assert kinds[-1] == "Metadata" and received.close_code == 1000, kinds[-3:]
    metadata = received.messages[-1]
    assert metadata.duration == pytest.approx(jfk.duration, abs=0.05)
    assert "SpeechStarted" in kinds and "UtteranceEnd" in kinds
    assert any(m.speech_final for m in results)
    assert {m.metadata.model_info.name for m in results} == {"nova-3"}
    # Final Results carry the final's words: in order, inside the result, with confidences.
    for final in (m for m in results if m.is_final and m.channel.alternatives[0].transcript):
        alternative = final.channel.alternatives[0]
        words = alternative.words or []
        assert "".join(w.punctuated_word or "" for w in words) == alternative.transcript.replace(
            " ", ""
        )
        assert all(0 < (w.confidence or 0) <= 1 for w in words)
        span = (final.start - 0.001, final.start + final.duration + 0.001)
        assert all(span[0] <= w.start <= w.end <= span[1] for w in words)
    # The same finals reach the meeting's listener and its stored transcript (as Whisper
    # wrote them: punctuate=true only capitalizes and ends the Deepgram sentences).
    sent = [plain(text) for text in finals(received)]
    assert [plain(f["text"]) for f in heard.finals] == sent
    assert {f["participant"] for f in heard.finals} == {"dg-bot"}
    status, body = parley_server.get(f"/v1/meetings/{meeting}/transcript")
    assert status == 200
    assert [plain(f["text"]) for f in orjson.loads(body)["finals"]] == sent


async def test_deepgram_finalize_gives_from_finalize(parley_server: ServerProcess) -> None:
    """Finalize in the middle of speech: the utterance so far comes back at once as a final
    Results marked from_finalize; the stream goes on and closes cleanly."""
    client = deepgram_client(parley_server.http_url, parley_server.ws_url)
    pcm = clip("en_ls_1089-134686-0001").pcm16()
    async with client.listen.v1.connect(
        model="nova-3", encoding="linear16", sample_rate=16000, interim_results="false"
    ) as connection:
        received = Received()
        reader = asyncio.create_task(receive_deepgram(connection, received))
        cut = 16_000 * 2 * 3  # 3 s in: mid-sentence
        await paced(pcm[:cut], 16_000, connection.send_media)
        await connection.send_finalize()
        await received.wait_for(lambda r: any(m.from_finalize for m in r.of_type("Results")), 60)
        await paced(pcm[cut:], 16_000, connection.send_media)
        await connection.send_close_stream()
        await asyncio.wait_for(reader, TIMEOUT)
    [finalized] = [m for m in received.of_type("Results") if m.from_finalize]
    assert finalized.is_final and finalized.channel.alternatives[0].transcript
    assert finalized.start + finalized.duration <= 3.05
    assert not any(not m.is_final for m in received.of_type("Results"))  # interim off
    assert received.messages[-1].type == "Metadata" and received.close_code == 1000


async def test_openai_sdk_transcription_session(parley_server: ServerProcess) -> None:
    """The openai SDK's realtime transcription session on a LibriSpeech clip at 24 kHz:
    speech_started/stopped, deltas before the completed transcripts, committed items in
    order, completed text within WER 0.15."""
    speech = clip("en_ls_2412-153948-0000")
    client = openai_client(parley_server.http_url)
    async with client.realtime.connect(extra_query={"intent": "transcription"}) as connection:
        received = Received()
        reader = asyncio.create_task(receive_openai(connection, received))
        await connection.session.update(session=transcription_session())

        async def append(chunk: bytes) -> None:
            await connection.input_audio_buffer.append(audio=b64(chunk))

        await paced(pcm16_at(speech.samples(), 24_000), 24_000, append)
        mark = len(received.messages)
        await connection.input_audio_buffer.commit()
        await answered(received, mark)
        await connection.close()
        await reader
    kinds = [m.type for m in received.messages]
    assert kinds[0] == "session.created" and "session.updated" in kinds
    completed = received.of_type("conversation.item.input_audio_transcription.completed")
    first_done = kinds.index("conversation.item.input_audio_transcription.completed")
    assert "conversation.item.input_audio_transcription.delta" in kinds[:first_done]
    assert kinds.index("input_audio_buffer.speech_started") < first_done
    committed = received.of_type("input_audio_buffer.committed")
    assert [c.item_id for c in committed] == [c.item_id for c in completed]
    assert [c.previous_item_id for c in committed[1:]] == [c.item_id for c in committed[:-1]]
    text = " ".join(c.transcript for c in completed)
    wer = error_rate(speech.reference, text)
    deltas = len(received.of_type("conversation.item.input_audio_transcription.delta"))
    print(f"openai {speech.id}: WER {wer:.3f}, {len(completed)} items, {deltas} deltas")
    assert wer <= 0.15, text


async def test_deepgram_finalize_in_mid_word_costs_at_most_that_word(
    parley_server: ServerProcess,
) -> None:
    """JFK over Deepgram's protocol on a raw socket at real time, `Finalize` at 6.0 s
    (inside "your country"): the final it closes is marked from_finalize and holds the
    audio up to the cut, the next final starts exactly there (no audio dropped) and is
    decoded behind the cut one, so the stream's WER stays within 0.15 (0.182 when the
    audio after the cut was decoded cold); interim results came before the first final,
    and CloseStream ends in Metadata."""
    jfk = clip("en_jfk")
    pcm, step, cut = jfk.pcm16(), 3200, 16_000 * 2 * 6
    query = "encoding=linear16&sample_rate=16000&interim_results=true&punctuate=true"
    async with connect(f"{parley_server.ws_url}/v1/listen?{query}") as ws:
        reader = asyncio.create_task(drain(ws))
        started = time.monotonic()
        for i, offset in enumerate(range(0, len(pcm), step)):
            if offset == cut:
                await ws.send('{"type": "Finalize"}')
            await ws.send(pcm[offset : offset + step])
            await asyncio.sleep(max(0.0, started + (i + 1) * FRAME_S - time.monotonic()))
        await ws.send('{"type": "CloseStream"}')
        messages = await asyncio.wait_for(reader, TIMEOUT)
    results = [m for m in messages if m["type"] == "Results"]
    spoken = [m for m in results if m["is_final"] and m["channel"]["alternatives"][0]["transcript"]]
    text = " ".join(m["channel"]["alternatives"][0]["transcript"] for m in spoken)
    wer = error_rate(jfk.reference, text)
    print(f"deepgram en_jfk, Finalize at 6.0 s: WER {wer:.3f}: {text!r}")
    first_final = next(i for i, m in enumerate(results) if m["is_final"])
    assert any(not m["is_final"] for m in results[:first_final]), "no interim before the final"
    [finalized] = [i for i, m in enumerate(spoken) if m["from_finalize"]]
    closed, after = spoken[finalized], spoken[finalized + 1]
    assert closed["start"] + closed["duration"] == pytest.approx(6.0, abs=0.04)
    assert after["start"] == pytest.approx(closed["start"] + closed["duration"], abs=0.002)
    assert wer <= 0.15, text
    assert messages[-1]["type"] == "Metadata"


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng and sox")
async def test_deepgram_keyterms_reach_the_servers_prompt(
    parley_server: ServerProcess, tmp_path: Path
) -> None:
    """A rare name through the Deepgram SDK with `keyterm`: the server's finals read the
    terms in the prompt, so "Siobhan" is written, where the bonus and the sound-alike
    rewrite alone leave "Shimon" (the server once read no keyterm prompt: its previous-text
    room, `PARLEY_PROMPT_TOKENS`, is 0 by default)."""
    sentence, terms = TUNING[0]  # "Please ask Siobhan Nakamura to review the Kubernetes ..."
    audio = speak(sentence, "en-us", tmp_path)
    client = deepgram_client(parley_server.http_url, parley_server.ws_url)
    async with client.listen.v1.connect(
        model="nova-3",
        encoding="linear16",
        sample_rate=16000,
        interim_results="false",
        keyterm=list(terms),
    ) as connection:
        received = Received()
        reader = asyncio.create_task(receive_deepgram(connection, received))
        await paced(pcm16_at(audio, 16_000) + bytes(16_000), 16_000, connection.send_media)
        await connection.send_close_stream()
        await asyncio.wait_for(reader, TIMEOUT)
    text = " ".join(finals(received))  # lower case: Deepgram's without `punctuate`
    assert "siobhan nakamura" in text and "kubernetes" in text, text
