"""Diarization end to end: the real models (Whisper tiny.en, Silero VAD, Resemblyzer's
d-vectors) on mixes of real corpus speakers, through a real server (one per module)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import wave
from collections.abc import AsyncIterator, Sequence
from io import BytesIO

import numpy as np
import orjson
import pytest
from websockets.asyncio.client import connect

from engine.speakers import SpeakerEmbedder
from server.app import whisper_recognizer
from session.diarizer import DiarizerConfig
from tests.support.appserver import AppServer, serve_app
from tests.support.corpus import clips
from tests.support.wsclient import StreamResult, receive_all, stream_pcm

pytestmark = pytest.mark.slow

RATE = 16_000
# Two corpus speakers taking turns; gaps under 0.5 s join two turns in one utterance.
TWO = [
    ("LJ", "en_lj_LJ001-0001", 0.6),
    ("mfa", "en_mfa_words", 0.3),
    ("LJ", "en_lj_LJ001-0003", 0.9),
    ("mfa", "en_mfa_thoughts", 0.4),
    ("LJ", "en_lj_LJ001-0004", 0.7),
    ("mfa", "en_mfa_uhum", 0.5),
]
ONE = [
    ("LJ", "en_lj_LJ001-0005", 0.6),
    ("LJ", "en_lj_LJ001-0006", 0.4),
    ("LJ", "en_lj_LJ001-0007", 0.8),
]

Turns = list[tuple[str, float, float]]


def mix(turns: Sequence[tuple[str, str, float]]) -> tuple[bytes, Turns]:
    """pcm_s16le of the clips with their gaps before them; (speaker, start, end) per turn."""
    corpus = clips()
    pieces: list[np.ndarray] = []
    spans: Turns = []
    position = 0
    for speaker, clip_id, gap in turns:
        silence = np.zeros(int(gap * RATE), np.float32)
        audio = corpus[clip_id].samples()
        pieces += [silence, audio]
        position += len(silence)
        spans.append((speaker, position / RATE, (position + len(audio)) / RATE))
        position += len(audio)
    pieces.append(np.zeros(RATE, np.float32))
    samples = np.concatenate(pieces)
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes(), spans


def word_accuracy(finals: Sequence[dict[str, object]], turns: Turns) -> float:
    """Share of the finals' words attributed to the right speaker under the best mapping of
    labels to speakers; a final's words are shared among the turns it overlaps by time."""
    speakers = sorted({s for s, _, _ in turns})
    labels = sorted({str(f["speaker"]) for f in finals})
    mass = np.zeros((len(labels), len(speakers)))
    for final in finals:
        start, end = float(final["start"]), float(final["end"])  # type: ignore[arg-type]
        words = len(str(final["text"]).split())
        overlaps = np.zeros(len(speakers))
        for speaker, t0, t1 in turns:
            overlaps[speakers.index(speaker)] += max(0.0, min(end, t1) - max(start, t0))
        if overlaps.sum() > 0:
            mass[labels.index(str(final["speaker"]))] += words * overlaps / overlaps.sum()
    best = max(
        sum(mass[r, c] for r, c in zip(rows, range(len(speakers)), strict=False))
        for rows in itertools.permutations(range(len(labels)), min(len(labels), len(speakers)))
    )
    return float(best / mass.sum())


@pytest.fixture(scope="module")
async def server() -> AsyncIterator[AppServer]:
    async with serve_app(whisper_recognizer, admit_max_queue_wait_ms=0) as app:
        yield app


async def test_two_corpus_speakers_get_two_labels(server: AppServer) -> None:
    """A mix of two corpus speakers: two labels, and ≥ 90 % of words on the right one."""
    pcm, turns = mix(TWO)
    result = await stream_pcm(
        server.ws_url, "diarize-two", pcm, speed=0, diarize=True, interim_results=False
    )
    assert result.messages[0]["config"]["diarize"] is True
    assert result.messages[-1]["type"] == "session.ended"
    status, _, body = await server.request("GET", "/v1/meetings/diarize-two/transcript")
    finals = orjson.loads(body)["finals"]
    assert status == 200 and len(finals) >= 6
    assert {f["speaker"] for f in finals} == {"S1", "S2"}
    assert word_accuracy(finals, turns) >= 0.9, finals
    # What the stream was told agrees with the log once its relabels are applied.
    told = {f["utterance_id"]: f["speaker"] for f in result.finals}
    told.update({m["utterance_id"]: m["speaker"] for m in result.of_type("transcript.speaker")})
    assert told == {f["utterance_id"]: f["speaker"] for f in finals}


async def test_one_speaker_gets_one_label(server: AppServer) -> None:
    """A stream of one corpus speaker keeps one label."""
    pcm, _ = mix(ONE)
    result = await stream_pcm(
        server.ws_url, "diarize-one", pcm, speed=0, diarize=True, interim_results=False
    )
    assert len(result.finals) >= 3
    status, _, body = await server.request("GET", "/v1/meetings/diarize-one/transcript")
    assert status == 200
    assert {f["speaker"] for f in orjson.loads(body)["finals"]} == {"S1"}


async def test_relabel_reaches_stream_listener_and_transcript(server: AppServer) -> None:
    """Online labels that re-clustering corrects: `transcript.speaker` goes to the stream
    and to a listener, and GET …/transcript returns the corrected labels."""
    services = server.state.services
    assert services is not None
    # Online, every part looks like the first speaker; the re-clustering knows better.
    server.state.services = dataclasses.replace(
        services, diarizer=DiarizerConfig(new_speaker_similarity=-1.0)
    )
    listener = StreamResult()
    try:
        async with connect(f"{server.ws_url}/v1/meetings/diarize-relabel/events") as ws:
            listening = asyncio.create_task(receive_all(ws, listener))
            pcm, turns = mix(TWO[:4])
            result = await stream_pcm(
                server.ws_url, "diarize-relabel", pcm, speed=0, diarize=True, interim_results=False
            )
            relabels = result.of_type("transcript.speaker")
            assert relabels, "re-clustering changed no label"
            sent = {f["utterance_id"]: f["speaker"] for f in result.finals}
            assert any(sent[m["utterance_id"]] != m["speaker"] for m in relabels)
            assert result.messages.index(relabels[-1]) < len(result.messages) - 1
            await asyncio.wait_for(
                listener.wait_for(lambda r: len(r.of_type("transcript.speaker")) >= len(relabels)),
                10,
            )
            await ws.close()
            await listening
    finally:
        server.state.services = services
    assert listener.of_type("transcript.speaker") == relabels
    status, _, body = await server.request("GET", "/v1/meetings/diarize-relabel/transcript")
    assert status == 200
    finals = orjson.loads(body)["finals"]
    latest = {f["utterance_id"]: f["speaker"] for f in result.finals}
    latest.update({m["utterance_id"]: m["speaker"] for m in relabels})
    assert {f["utterance_id"]: f["speaker"] for f in finals} == latest
    assert {f["speaker"] for f in finals} == {"S1", "S2"}
    assert word_accuracy(finals, turns) >= 0.9
    _, _, text = await server.request("GET", "/v1/meetings/diarize-relabel/transcript?format=txt")
    assert "speaker (S2): " in text.decode()


async def test_upload_with_diarize(server: AppServer) -> None:
    """An uploaded recording of two speakers comes back with two labels."""
    pcm, turns = mix(TWO[:4])
    buffer = BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(RATE)
        wav.writeframes(pcm)
    boundary = "diarizeboundary"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="two.wav"\r\n'
            "Content-Type: audio/wav\r\n\r\n"
        ).encode()
        + buffer.getvalue()
        + f"\r\n--{boundary}--\r\n".encode()
    )
    status, _, reply = await server.request(
        "POST",
        "/v1/transcriptions?wait=true&diarize=true",
        body=body,
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
        timeout=120,
    )
    assert status == 200, reply
    job = orjson.loads(reply)
    assert job["options"]["diarize"] is True
    utterances = job["result"]["utterances"]
    assert {u["speaker"] for u in utterances} == {"S1", "S2"}
    assert word_accuracy(utterances, turns) >= 0.9


async def test_without_diarize_nothing_changes(server: AppServer) -> None:
    """No `diarize`: no speaker anywhere, and the speaker model is never run."""
    services = server.state.services
    assert services is not None and isinstance(services.speakers, SpeakerEmbedder)
    before = services.speakers.stats.utterances
    pcm, _ = mix(ONE[:1])
    result = await stream_pcm(server.ws_url, "no-diarize", pcm, speed=0, interim_results=False)
    assert "diarize" not in result.messages[0]["config"]
    assert result.finals and all("speaker" not in f for f in result.finals)
    assert not result.of_type("transcript.speaker")
    _, _, body = await server.request("GET", "/v1/meetings/no-diarize/transcript")
    assert all("speaker" not in f for f in orjson.loads(body)["finals"])
    assert services.speakers.stats.utterances == before
