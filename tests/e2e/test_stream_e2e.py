"""End to end: a real server (real model) and real speech over real WebSockets."""

from __future__ import annotations

import asyncio
import itertools
import math
import re
from typing import Any

import numpy as np
import orjson
import pytest
import soxr
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import connect

from loadgen.wer import error_counts, error_rate
from tests.support.corpus import clip
from tests.support.servers import ServerProcess
from tests.support.wsclient import StreamResult, receive_all, stream_pcm, stream_url

pytestmark = pytest.mark.slow

LIBRISPEECH = ["en_ls_1089-134686-0001", "en_ls_2412-153948-0000", "en_ls_61-70968-0000"]


def assert_well_formed(result: StreamResult) -> None:
    """Order and bookkeeping every stream ending in `stop` must satisfy."""
    kinds = [m["type"] for m in result.messages]
    assert kinds[0] == "session.started"
    assert kinds[-1] == "session.ended", kinds[-5:]
    assert result.close_code == 1000
    finals = result.finals
    ids = [f["utterance_id"] for f in finals]
    assert len(ids) == len(set(ids)), "duplicate utterance_id"
    assert all(f["end"] > f["start"] >= 0 for f in finals)
    assert all(b["start"] >= a["end"] - 0.3 for a, b in itertools.pairwise(finals))
    ended = result.messages[-1]
    assert ended["finals"] == len(finals) and ended["reason"] == "stop"


def scrape(server: ServerProcess) -> dict[str, Any]:
    status, body = server.get("/metrics")
    assert status == 200
    samples: dict[str, Any] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            key = sample.name + "".join(f"|{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[key] = sample.value
    return samples


async def test_corpus_clips_stream_to_correct_finals(parley_server: ServerProcess) -> None:
    """JFK and three LibriSpeech clips, four rooms at once in real time: correct finals,
    partials first, gap-free seq, stop → every final then session.ended."""
    ids = ["en_jfk", *LIBRISPEECH]
    results = await asyncio.gather(
        *(
            stream_pcm(
                parley_server.ws_url,
                f"e2e-room-{i}",
                clip(c).pcm16(),
                participant=f"p{i}",
                trailing_silence=1.0,
            )
            for i, c in enumerate(ids)
        )
    )
    total = None
    for clip_id, result in zip(ids, results, strict=True):
        assert_well_formed(result)
        reference = clip(clip_id).reference
        counts = error_counts(reference, result.text)
        total = counts if total is None else total + counts
        assert counts.rate <= 0.2, (clip_id, result.text)
        # Partials first: each partial comes before its utterance's final (a partial still
        # running when its final is committed is dropped), and some final had one. Not
        # necessarily the first final: under load partials thin out first, by design.
        final_at = {
            m["utterance_id"]: i
            for i, m in enumerate(result.messages)
            if m["type"] == "transcript.final"
        }
        led = [
            (i, final_at.get(m["utterance_id"], math.inf))
            for i, m in enumerate(result.messages)
            if m["type"] == "transcript.partial"
        ]
        assert all(i < final for i, final in led), (clip_id, led)
        assert any(final < math.inf for _, final in led), (clip_id, "no final had a partial")
        assert [f["seq"] for f in result.finals] == list(range(1, len(result.finals) + 1))
        session_id = result.messages[0]["session_id"]
        assert all(f["utterance_id"].startswith(session_id) for f in result.finals)
        assert all(m["participant"] == result.messages[0]["participant"] for m in result.finals)
        assert all({"queue", "inference", "total"} <= set(f["timing"]) for f in result.finals)
    assert total is not None and total.rate <= 0.15


async def test_rooms_share_the_models_batches(parley_server: ServerProcess) -> None:
    """Four rooms streaming at once as fast as they can send: the one scheduler batches
    requests from several rooms together (in real time on an idle machine rooms seldom
    need the model at the same moment, so that is not the place to look for it)."""
    before = scrape(parley_server)
    ids = ["en_jfk", *LIBRISPEECH]
    results = await asyncio.gather(
        *(
            stream_pcm(parley_server.ws_url, f"e2e-shared-{i}", clip(c).pcm16(), speed=0)
            for i, c in enumerate(ids)
        )
    )
    for clip_id, result in zip(ids, results, strict=True):
        assert_well_formed(result)
        assert error_rate(clip(clip_id).reference, result.text) <= 0.2, (clip_id, result.text)
    after = scrape(parley_server)
    key_all, key_single = "parley_batch_sessions_count", "parley_batch_sessions_bucket|le=1.0"
    batches = after[key_all] - before.get(key_all, 0)
    single = after[key_single] - before.get(key_single, 0)
    assert batches > single, "no batch held requests from two rooms"
    # /metrics counts the live streams' VAD: every 32 ms window of the four clips, in as
    # many model calls or fewer (several streams' windows in one call).
    windows = after["parley_vad_windows_total"] - before.get("parley_vad_windows_total", 0)
    calls = after["parley_vad_calls_total"] - before.get("parley_vad_calls_total", 0)
    audio = sum(len(clip(c).samples()) // 512 for c in ids)
    assert audio <= windows <= audio + 4 * 64 and 0 < calls <= windows, (audio, windows, calls)


async def test_listener_receives_both_participants_in_seq_order(
    parley_server: ServerProcess,
) -> None:
    """A listener sees every final of two participants of its meeting in seq order; a late
    listener gets the same finals replayed from the log, in meeting-time order."""
    meeting = "e2e-listened"
    heard: StreamResult = StreamResult()
    async with connect(f"{parley_server.ws_url}/v1/meetings/{meeting}/events") as listener:
        receiver = asyncio.create_task(receive_all(listener, heard))
        a, b = await asyncio.gather(
            stream_pcm(
                parley_server.ws_url,
                meeting,
                clip("en_jfk").pcm16(),
                participant="alice",
                speed=1.5,
            ),
            stream_pcm(
                parley_server.ws_url,
                meeting,
                clip(LIBRISPEECH[1]).pcm16(),
                participant="bob",
                speed=1.5,
            ),
        )
        streamed_count = len(a.finals) + len(b.finals)
        async with asyncio.timeout(30):  # published as the streams got them: however late
            await heard.wait_for(lambda r: len(r.finals) >= streamed_count)
        await asyncio.sleep(0.5)  # room for a final too many, which would be a fault
        await listener.close()
        await receiver
    finals = heard.finals
    assert [f["seq"] for f in finals] == list(range(1, len(finals) + 1))
    assert {f["participant"] for f in finals} == {"alice", "bob"}
    streamed = sorted(a.finals + b.finals, key=lambda f: f["seq"])
    assert [(f["seq"], f["text"]) for f in finals] == [(f["seq"], f["text"]) for f in streamed]
    assert heard.of_type("transcript.partial"), "listener got no partials"

    late = StreamResult()
    async with connect(f"{parley_server.ws_url}/v1/meetings/{meeting}/events") as listener:
        receiver = asyncio.create_task(receive_all(listener, late))
        async with asyncio.timeout(30):  # the log replayed: however long that takes
            await late.wait_for(lambda r: len(r.finals) >= len(finals))
        await asyncio.sleep(0.5)  # room for a final too many, which would be a fault
        await listener.close()
        await receiver
    # The replay comes in meeting-time order (docs/protocol.md#one-meeting-timeline):
    # by each final's wall-clock start, then seq; the live finals above came in seq order.
    in_meeting_order = sorted(finals, key=lambda f: (f["wall_time"]["start"], f["seq"]))
    assert [f["text"] for f in late.finals] == [f["text"] for f in in_meeting_order]


def parse_srt(text: str) -> list[tuple[float, float, str]]:
    cues = []
    for block in text.strip().split("\n\n"):
        lines = block.split("\n")
        assert lines[0].isdigit(), block
        m = re.fullmatch(r"(\d\d):(\d\d):(\d\d),(\d{3}) --> (\d\d):(\d\d):(\d\d),(\d{3})", lines[1])
        assert m, lines[1]
        v = [int(x) for x in m.groups()]
        start = v[0] * 3600 + v[1] * 60 + v[2] + v[3] / 1000
        end = v[4] * 3600 + v[5] * 60 + v[6] + v[7] / 1000
        assert end > start
        cues.append((start, end, " ".join(lines[2:])))
    return cues


async def test_transcript_endpoint_serves_json_srt_and_vtt(parley_server: ServerProcess) -> None:
    """GET …/transcript returns the streamed finals as JSON, and valid SRT and VTT."""
    meeting = "e2e-transcript"
    result = await stream_pcm(
        parley_server.ws_url, meeting, clip(LIBRISPEECH[0]).pcm16(), participant="carol", speed=2.0
    )
    status, body = parley_server.get(f"/v1/meetings/{meeting}/transcript?format=json")
    assert status == 200
    logged = orjson.loads(body)["finals"]
    streamed = [{k: v for k, v in f.items() if k != "timing"} for f in result.finals]
    assert logged == streamed and logged

    status, body = parley_server.get(f"/v1/meetings/{meeting}/transcript?format=srt")
    assert status == 200
    cues = parse_srt(body.decode())
    # Each final is one cue or, past 42 characters or 7 s, several cut between its words.
    assert all(c[2].startswith("carol: ") for c in cues)
    texts = " ".join(c[2].removeprefix("carol: ") for c in cues)
    assert texts == " ".join(f["text"] for f in result.finals)
    assert {f["start"] for f in result.finals} <= {c[0] for c in cues}
    assert len(cues) > len(result.finals)  # a LibriSpeech sentence is longer than one cue
    assert all(f["words"] for f in result.finals)

    status, body = parley_server.get(f"/v1/meetings/{meeting}/transcript?format=vtt")
    vtt = body.decode()
    assert status == 200 and vtt.startswith("WEBVTT\n\n")
    assert len(re.findall(r"^\d\d:\d\d:\d\d\.\d{3} --> \d\d:\d\d:\d\d\.\d{3}$", vtt, re.M)) == len(
        cues
    )
    status, body = parley_server.get(f"/v1/meetings/{meeting}/transcript?format=txt")
    assert status == 200 and body.decode().count("carol: ") == len(result.finals)
    assert parley_server.get(f"/v1/meetings/{meeting}/transcript?format=doc")[0] == 400
    assert parley_server.get("/v1/meetings/never-held/transcript")[0] == 404


async def open_and_collect(url: str, *frames: bytes | str, wait: float = 10) -> StreamResult:
    result = StreamResult()
    async with connect(url, max_size=None) as ws:
        receiver = asyncio.create_task(receive_all(ws, result))
        for frame in frames:
            await ws.send(frame)
        await asyncio.wait_for(receiver, wait)
    return result


def nan_frame() -> bytes:
    samples = np.zeros(320, dtype="<f4")
    samples[100] = math.nan
    return samples.tobytes()


async def test_malformed_input_gets_named_close_codes(parley_server: ServerProcess) -> None:
    """Each malformed input gets an `error` and its close code; a healthy room beside them
    still finishes with a correct transcript."""
    base = parley_server.ws_url
    healthy = asyncio.create_task(
        stream_pcm(base, "e2e-healthy", clip(LIBRISPEECH[2]).pcm16(), speed=1.0)
    )
    url = stream_url(base, "e2e-bad")
    cases: list[tuple[str, str, list[bytes | str], int, str]] = [
        ("encoding", stream_url(base, "e2e-bad", encoding="opus"), [], 4400, "bad_config"),
        ("rate", stream_url(base, "e2e-bad", sample_rate=4000), [], 4400, "bad_config"),
        ("meeting id", f"{base}/v1/meetings/bad%20id/stream", [], 4400, "bad_config"),
        ("odd bytes", url, [b"\x00" * 321], 1007, "invalid_audio"),
        (
            "nan",
            stream_url(base, "e2e-bad", encoding="pcm_f32le"),
            [nan_frame()],
            1007,
            "invalid_audio",
        ),
        ("not json", url, ["{nope"], 1007, "invalid_message"),
        ("unknown type", url, ['{"type": "dance"}'], 1007, "invalid_message"),
        ("no type", url, ["[1, 2]"], 1007, "invalid_message"),
        ("oversize", url, [b"\x00" * (2 << 20)], 1009, "frame_too_large"),
        (
            "listener audio",
            f"{base}/v1/meetings/e2e-bad/events",
            [b"\x00\x00"],
            1003,
            "unsupported_data",
        ),
    ]
    outcomes = await asyncio.gather(*(open_and_collect(u, *f) for _, u, f, _, _ in cases))
    for (name, _, _, code, error), result in zip(cases, outcomes, strict=True):
        assert result.close_code == code, (name, result.close_code, result.messages)
        errors = result.of_type("error")
        assert errors and errors[-1]["code"] == error, (name, result.messages)
        assert errors[-1]["message"]
    good = await healthy
    assert_well_formed(good)
    assert error_rate(clip(LIBRISPEECH[2]).reference, good.text) <= 0.2
    assert parley_server.get("/healthz")[0] == 200


@pytest.mark.parametrize(("rate", "encoding"), [(8000, "pcm_s16le"), (48000, "pcm_f32le")])
async def test_other_sample_rates_are_resampled(
    parley_server: ServerProcess, rate: int, encoding: str
) -> None:
    """8 kHz s16 and 48 kHz f32 streams are resampled and transcribed correctly."""
    jfk = clip("en_jfk")
    audio = soxr.resample(jfk.samples(), 16000, rate)
    if encoding == "pcm_s16le":
        pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
    else:
        pcm = audio.astype("<f4").tobytes()
    # stream_pcm paces 16 kHz s16 bytes; scale the speed so the real rate is 2x real time.
    speed = 2.0 * len(pcm) / (jfk.duration * 32_000)
    result = await stream_pcm(
        parley_server.ws_url,
        f"e2e-rate-{rate}",
        pcm,
        speed=speed,
        sample_rate=rate,
        encoding=encoding,
    )
    assert_well_formed(result)
    assert error_rate(jfk.reference, result.text) <= 0.15
    assert abs(result.messages[-1]["audio_seconds"] - jfk.duration) < 0.1


async def test_silence_and_noise_produce_no_words(parley_server: ServerProcess) -> None:
    """Ten seconds of silence, then ten of low noise: no final carries words."""
    rng = np.random.default_rng(7)
    silence = np.zeros(160_000)
    noise = rng.standard_normal(160_000) * 10 ** (-45 / 20)
    pcm = (np.concatenate([silence, noise]) * 32767).astype("<i2").tobytes()
    result = await stream_pcm(parley_server.ws_url, "e2e-quiet", pcm, speed=8.0)
    assert_well_formed(result)
    assert result.finals == []
