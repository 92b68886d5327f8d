"""End to end, real model and real turn model: an unfinished thought is not closed at its
pause, a finished one is, and the stream says so with turn events."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.meetings import Voice
from bench.turns import longest_pause, speak
from tests.support.compat_clients import (
    WEBSOCKETS_LEGACY,
    Received,
    b64,
    deepgram_client,
    openai_client,
    pcm16_at,
    receive_deepgram,
    receive_openai,
    transcription_session,
)
from tests.support.corpus import clip
from tests.support.servers import ServerProcess, start_server
from tests.support.wsclient import stream_pcm

pytestmark = pytest.mark.slow

TURN_MODEL = {"PARLEY_TURN_MODEL": "true"}
# The held-out example of issue 46: no setting was fitted to it (bench/turns.py).
UNFINISHED = 'I was thinking that we should <break time="550ms"/> move the meeting'


@pytest.fixture(scope="module")
def turn_server() -> Iterator[ServerProcess]:
    server = start_server(TURN_MODEL)
    yield server
    server.stop()


def unfinished_thought() -> tuple[bytes, float, float]:
    """The sentence with its pause (espeak-ng, spoken now), 0.3 s of silence before it:
    its 16-bit PCM and where its pause starts and ends, in seconds."""
    with tempfile.TemporaryDirectory() as folder:
        speech = speak(Voice("en-us", 175, 50), UNFINISHED, Path(folder))
    stop, resume = longest_pause(speech)
    lead = 4800
    audio = np.concatenate([np.zeros(lead, np.float32), speech])
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
    return pcm, (lead + stop) / 16000, (lead + resume) / 16000


@pytest.mark.xfail(
    reason="issue 46, open: the words come from the utterance's speculative final; under the "
    "suite's load (two test workers) it was once not decoded within the 192 ms the check waits "
    "(CI of b0a16fb) and the model alone decided at one wavering window. Since the check "
    "expedites it (a02e513) it passed in stop 57's CI; non-strict until more runs say so",
    strict=False,
)
async def test_an_unfinished_thought_is_not_closed_at_its_pause(
    turn_server: ServerProcess,
) -> None:
    """The held-out unfinished thought (a 0.55 s pause mid-sentence): the pause is longer
    than the silence that ends an utterance (384 ms), but the turn is judged unfinished, so
    it stays one utterance: one final holding both halves, one `turn.ended` (after the
    pause, for that final's utterance, with the model's probability). The stream asks for
    eager ends from a probability of 0.01, which any answer of the model at the pause
    reaches: none comes, because its words so far ("... that we should", the speculative
    final's) stop where a sentence cannot end (PARLEY_TURN_WORDS, session/turn_words.py).
    Without them the model alone decides at one 32 ms window of the pause, where it wavers
    (0.36-0.76 across 160-256 ms on one machine: docs/performance.md#end-of-turn)."""
    pcm, stop, resume = unfinished_thought()
    assert resume - stop > 0.5
    result = await stream_pcm(
        turn_server.ws_url,
        "turn-unfinished",
        pcm,
        trailing_silence=1.5,
        turn_events=True,
        turn_eager=0.01,
    )
    finals = result.finals
    assert len(finals) == 1, [f["text"] for f in finals]
    text = finals[0]["text"].lower()
    assert "thinking" in text and "meeting" in text
    ended = result.of_type("turn.ended")
    assert ended and all(e["t"] > resume for e in ended), ended  # none in the pause
    closing = [e for e in ended if not e["eager"]]  # the end may be said eagerly first
    assert [e["utterance_id"] for e in closing] == [finals[0]["utterance_id"]], ended
    kinds = [m["type"] for m in result.messages]
    assert kinds.index("turn.ended") < kinds.index("transcript.final")


async def test_a_finished_turn_is_closed_by_the_model(turn_server: ServerProcess) -> None:
    """A read sentence the model judges finished: its `turn.ended` carries the model's
    probability (>= 0.5: the model closed it at the short silence, not the silence rule,
    which would leave it null) and names the utterance of the final that follows."""
    pcm = clip("en_ls_1221-135766-0002").pcm16()
    result = await stream_pcm(
        turn_server.ws_url, "turn-finished", pcm, trailing_silence=1.5, turn_events=True
    )
    ended = result.of_type("turn.ended")
    assert ended and ended[-1]["probability"] is not None and ended[-1]["probability"] >= 0.5
    assert ended[-1]["utterance_id"] == result.finals[-1]["utterance_id"]


async def test_no_turn_events_unless_asked(turn_server: ServerProcess) -> None:
    """A stream that does not ask for `turn_events` gets none (protocol v1 unchanged)."""
    pcm = clip("en_ls_1221-135766-0002").pcm16()
    result = await stream_pcm(turn_server.ws_url, "turn-quiet", pcm, trailing_silence=1.0)
    assert result.finals
    assert not result.of_type("turn.ended") and not result.of_type("turn.resumed")


def openai_session(turns: dict[str, Any]) -> Any:
    """A GA transcription session's `session.update` with these turn detection settings."""
    session = transcription_session()
    session["audio"]["input"]["turn_detection"] = turns  # type: ignore[typeddict-item]
    return session


async def openai_items(server: ServerProcess, turns: dict[str, Any], pcm16k: bytes) -> Received:
    """Stream 16 kHz PCM through the openai SDK at 24 kHz in real time with these turn
    detection settings, commit and wait for every item's transcript."""
    samples = np.frombuffer(pcm16k, "<i2").astype(np.float32) / 32768
    pcm = pcm16_at(samples, 24_000)
    client = openai_client(server.http_url)
    async with client.realtime.connect(extra_query={"intent": "transcription"}) as connection:
        received = Received()
        reader = asyncio.create_task(receive_openai(connection, received))
        await connection.session.update(session=openai_session(turns))
        step = 2400 * 2  # 100 ms
        started = time.monotonic()
        for i, offset in enumerate(range(0, len(pcm), step)):
            await connection.input_audio_buffer.append(audio=b64(pcm[offset : offset + step]))
            await asyncio.sleep(max(0.0, started + (i + 1) * 0.1 - time.monotonic()))
        await connection.input_audio_buffer.commit()

        def finished(r: Received) -> bool:
            return any(
                m.type in ("input_audio_buffer.committed", "error") for m in r.messages[-3:]
            ) and len(r.of_type("input_audio_buffer.committed")) == len(
                r.of_type("conversation.item.input_audio_transcription.completed")
            )

        await received.wait_for(finished, 60)
        await connection.close()
        await reader
    return received


@WEBSOCKETS_LEGACY
async def test_openai_semantic_vad_keeps_an_unfinished_thought(turn_server: ServerProcess) -> None:
    """The openai SDK asks for `semantic_vad`: the session reports it with its eagerness,
    and the turn model keeps the held-out unfinished thought one item; the same audio in
    a `server_vad` session (the silence rule) is cut at the pause into two items."""
    pcm, _, _ = unfinished_thought()
    pcm += bytes(2 * 16000)  # a second of silence: the turn ends before the commit
    semantic = await openai_items(turn_server, {"type": "semantic_vad", "eagerness": "auto"}, pcm)
    updated = semantic.of_type("session.updated")[-1]
    detection = updated.session.audio.input.turn_detection
    assert detection.type == "semantic_vad" and detection.eagerness == "auto"
    items = semantic.of_type("conversation.item.input_audio_transcription.completed")
    texts = [i.transcript.lower() for i in items if i.transcript]
    assert len(texts) == 1 and "thinking" in texts[0] and "meeting" in texts[0], texts
    plain = await openai_items(turn_server, {"type": "server_vad"}, pcm)
    detection = plain.of_type("session.updated")[-1].session.audio.input.turn_detection
    assert detection.type == "server_vad"
    items = plain.of_type("conversation.item.input_audio_transcription.completed")
    assert len([i for i in items if i.transcript]) == 2


@WEBSOCKETS_LEGACY
async def test_flux_turn_events_through_deepgrams_sdk(turn_server: ServerProcess) -> None:
    """deepgram-sdk's own Flux client (`listen.v2.connect`) over a real socket: a finished
    sentence, 1.5 s of silence, then the held-out unfinished thought: `Connected`, then for
    each turn StartOfTurn … EndOfTurn in Flux's order (turn_index 0 then 1, `sequence_id`
    counting every message); the unfinished thought is one turn whose EndOfTurn holds
    both halves; `CloseStream` ends the stream."""
    sentence = clip("en_ls_1221-135766-0002").pcm16()
    thought, _, _ = unfinished_thought()
    pcm = sentence + bytes(2 * 24000) + thought + bytes(2 * 24000)
    client = deepgram_client(turn_server.http_url, turn_server.ws_url)
    async with client.listen.v2.connect(
        model="flux-general-en", encoding="linear16", sample_rate="16000"
    ) as connection:
        received = Received()
        reader = asyncio.create_task(receive_deepgram(connection, received))
        step = 3200  # 100 ms
        started = time.monotonic()
        for i, offset in enumerate(range(0, len(pcm), step)):
            await connection.send_media(pcm[offset : offset + step])
            await asyncio.sleep(max(0.0, started + (i + 1) * 0.1 - time.monotonic()))
        await received.wait_for(
            lambda r: len([m for m in r.of_type("TurnInfo") if m.event == "EndOfTurn"]) >= 2, 60
        )
        await connection.send_close_stream()
        await reader
    assert received.messages[0].type == "Connected"
    assert [m.sequence_id for m in received.messages] == list(range(len(received.messages)))
    turns = received.of_type("TurnInfo")
    ends = [m for m in turns if m.event == "EndOfTurn"]
    assert [m.turn_index for m in ends] == [0, 1]
    for index in (0, 1):
        events = [m.event for m in turns if m.turn_index == index]
        assert events[0] == "StartOfTurn" and events[-1] == "EndOfTurn"
        assert set(events[1:-1]) <= {"Update"}, events
    assert "meeting" in ends[1].transcript.lower() and "thinking" in ends[1].transcript.lower()
    assert ends[0].trigger in ("model", "timeout")
    assert all(w.word.strip() for w in ends[0].words)  # words: when its finals have them
    assert received.close_code == 1000
