"""The load generator's socket client: send timing, latency, and every way a session ends."""

from __future__ import annotations

import time

import numpy as np
import pytest

from loadgen.client import (
    SendClock,
    SourceLog,
    StreamOptions,
    Track,
    stream_source,
    stream_url,
    websocket_base,
)
from tests.support.v1_stub import StubBehaviour, stub_server

SR = 16_000


def tone(seconds: float) -> np.ndarray:
    """Non-zero 'speech' the stub recognises by energy."""
    return np.full(round(seconds * SR), 1000, dtype=np.int16)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * SR), dtype=np.int16)


def two_utterances() -> Track:
    return Track((silence(0.2), tone(1.0), silence(0.6), tone(0.8), silence(0.5)))


def test_stream_url_and_base() -> None:
    """http:// becomes ws://, the path names the meeting, the query says 16 kHz s16."""
    assert websocket_base("http://127.0.0.1:8000/") == "ws://127.0.0.1:8000"
    assert websocket_base("127.0.0.1:9") == "ws://127.0.0.1:9"
    assert websocket_base("https://h.example") == "wss://h.example"
    with pytest.raises(ValueError):
        websocket_base("ftp://h")
    url = stream_url("http://127.0.0.1:8000", "m-1", "alice", interim_results=False)
    assert url == (
        "ws://127.0.0.1:8000/v1/meetings/m-1/stream?participant=alice&language=en"
        "&sample_rate=16000&encoding=pcm_s16le&interim_results=false"
    )


def test_track_frames_cross_piece_boundaries() -> None:
    """Frames are fixed-size across pieces, the last one short, nothing lost or reordered."""
    track = Track((np.arange(5, dtype=np.int16), np.arange(5, 12, dtype=np.int16)))
    frames = list(track.frames(4))
    assert [len(f) for f in frames] == [4, 4, 4]
    assert np.concatenate(frames).tolist() == list(range(12))
    assert track.total_samples == 12


def test_send_clock_maps_samples_to_their_frame() -> None:
    """A sample's send time is its frame's; `end` uses the span's last sample."""
    clock = SendClock()
    clock.record(640, 10.0)  # samples 0..639 (40 ms)
    clock.record(1280, 10.04)
    clock.record(1920, 10.08)
    assert clock.sample_sent_at(0) == 10.0
    assert clock.sample_sent_at(639) == 10.0
    assert clock.sample_sent_at(640) == 10.04
    assert clock.end_sent_at(0.04) == 10.0  # audio up to 40 ms: its last sample is #639
    assert clock.end_sent_at(0.0401) == 10.04
    assert clock.start_sent_at(0.04) == 10.04
    assert clock.end_sent_at(0.12) == 10.08
    assert clock.end_sent_at(0.13) is None  # not sent yet
    assert clock.samples_sent == 1920
    with pytest.raises(ValueError):
        clock.record(1920, 11.0)


def test_stream_options_validate() -> None:
    """Speed must be positive and frames 10-200 ms."""
    with pytest.raises(ValueError):
        StreamOptions(speed=0)
    with pytest.raises(ValueError):
        StreamOptions(frame_ms=5)
    assert StreamOptions(frame_ms=20).frame_samples == 320


async def test_clean_session_records_finals_partials_and_latency() -> None:
    """Two utterances give two finals with non-negative latency, then session.ended, 1000."""
    async with stub_server() as stub:
        log = SourceLog("m-clean", "alice")
        await stream_source(
            log, stub.url, two_utterances(), StreamOptions(speed=None), clock=time.monotonic
        )
    assert log.failure is None, log.detail
    assert log.close_code == 1000 and log.ended is not None
    assert [(f.message["start"], f.message["end"]) for f in log.finals] == [
        (0.2, 1.2),
        (1.8, 2.6),
    ]
    assert all(f.latency is not None and 0 <= f.latency < 5 for f in log.finals)
    assert log.partials and all(p.latency is not None for p in log.partials)
    assert log.clock.samples_sent == two_utterances().total_samples
    assert stub.controls == [("m-clean", "finalize"), ("m-clean", "stop")]


async def test_paced_session_keeps_real_time() -> None:
    """At 8x, frames go out on schedule: send lag stays small and is recorded per frame."""
    track = Track((tone(0.5), silence(0.5)))
    async with stub_server() as stub:
        log = SourceLog("m-paced", "bob")
        started = time.monotonic()
        await stream_source(
            log, stub.url, track, StreamOptions(speed=8.0, frame_ms=50), clock=time.monotonic
        )
        elapsed = time.monotonic() - started
    assert log.failure is None
    assert len(log.send_lags) == 20
    assert elapsed >= 1.0 / 8
    assert max(log.send_lags) < 0.5


async def test_http_refusal_is_recorded_by_status() -> None:
    """A handshake refused with 503 is a failure keyed http_503, not an exception."""
    async with stub_server(lambda m: StubBehaviour(http_status=503)) as stub:
        log = await stream_source(
            SourceLog("m", "a"),
            stub.url,
            two_utterances(),
            StreamOptions(speed=None),
            clock=time.monotonic,
        )
    assert log.failure == "http_503" and log.started is None and log.done


async def test_close_mid_stream_is_recorded_by_close_code() -> None:
    """A server closing 1013 mid-stream stops the sender and records '1013'."""
    async with stub_server(lambda m: StubBehaviour(close_after_s=0.5)) as stub:
        log = await stream_source(
            SourceLog("m", "a"),
            stub.url,
            two_utterances(),
            StreamOptions(speed=None),
            clock=time.monotonic,
        )
    assert log.failure == "1013" and log.close_code == 1013
    assert log.clock.samples_sent < two_utterances().total_samples


async def test_missing_session_ended_times_out() -> None:
    """No session.ended after stop ends in a bounded drain_timeout failure."""
    async with stub_server(lambda m: StubBehaviour(no_session_ended=True)) as stub:
        log = await stream_source(
            SourceLog("m", "a"),
            stub.url,
            two_utterances(),
            StreamOptions(speed=None, drain_timeout=0.3),
            clock=time.monotonic,
        )
    assert log.failure == "drain_timeout"
    assert len(log.finals) == 2


async def test_connection_refused_is_recorded() -> None:
    """Nothing listening: connect_failed."""
    async with stub_server() as stub:
        url = stub.url
    log = await stream_source(
        SourceLog("m", "a"),
        url,
        two_utterances(),
        StreamOptions(speed=None, open_timeout=2),
        clock=time.monotonic,
    )
    assert log.failure == "connect_failed"
