"""Resume: a dropped connection, a killed server or a restarted Redis loses no final and
repeats none."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from loadgen.wer import error_rate
from tests.support.corpus import Clip, clip
from tests.support.redis_support import RedisServer
from tests.support.servers import ServerProcess, start_server
from tests.support.timeouts import START_TIMEOUT
from tests.support.wsclient import (
    ResumableStream,
    StreamResult,
    receive_all,
    stream_pcm,
    stream_url,
)

pytestmark = pytest.mark.slow

JFK = "en_jfk"  # four phrases with clear pauses
LONG = "en_ls_1221-135766-0001"  # 16.7 s, several utterances


def spans(finals: list[dict[str, Any]]) -> list[tuple[float, float]]:
    return [(f["start"], f["end"]) for f in finals]


def assert_same_transcript(
    resumed: list[dict[str, Any]], baseline: list[dict[str, Any]], speech: Clip
) -> None:
    """No final lost or repeated: the same utterance spans and (near) the same words."""
    ids = [f["utterance_id"] for f in resumed]
    assert len(ids) == len(set(ids)), f"duplicate utterance ids: {ids}"
    seqs = [f["seq"] for f in resumed]
    assert seqs == sorted(set(seqs)), seqs
    assert len(resumed) == len(baseline), (spans(resumed), spans(baseline))
    for got, want in zip(spans(resumed), spans(baseline), strict=True):
        assert got == pytest.approx(want, abs=0.07), (spans(resumed), spans(baseline))
    text = " ".join(f["text"] for f in resumed)
    base_text = " ".join(f["text"] for f in baseline)
    # Identical audio can still differ by a word: a batch pads to its longest utterance.
    assert error_rate(base_text, text) <= 0.05, (text, base_text)
    assert error_rate(speech.reference, text) <= 0.2


async def baseline(server: ServerProcess, speech: Clip, speed: float) -> list[dict[str, Any]]:
    result = await stream_pcm(
        server.ws_url, f"baseline-{speech.id}-{time.monotonic_ns()}", speech.pcm16(), speed=speed
    )
    return result.finals


async def test_resume_after_drops_at_random_points(parley_server: ServerProcess) -> None:
    """Ten random drop points over five streams: each resumed transcript equals the
    uninterrupted one, with no duplicate utterance_id."""
    rng = random.Random(20261129)
    speed = 3.0
    runs = []
    for i in range(5):
        speech = clip(JFK if i % 2 == 0 else LONG)
        pcm = speech.pcm16()
        points = sorted(rng.randrange(16_000, len(pcm) - 16_000) // 2 * 2 for _ in range(2))
        runs.append(
            (
                speech,
                points,
                ResumableStream(
                    parley_server.ws_url, f"resume-{i}", pcm, participant=f"p{i}", speed=speed
                ),
            )
        )
    baselines = await asyncio.gather(
        *(baseline(parley_server, clip(c), speed) for c in (JFK, LONG))
    )
    expected = {JFK: baselines[0], LONG: baselines[1]}
    await asyncio.gather(*(stream.run(points) for _, points, stream in runs))
    for speech, points, stream in runs:
        assert len(stream.connections) == 3, points
        assert stream.connections[-1].messages[-1]["type"] == "session.ended"
        assert_same_transcript(stream.finals, expected[speech.id], speech)
    resume_ms = sorted(t * 1000 for _, _, s in runs for t in s.resume_times)
    print(
        f"resume time (connect → session.started): median {resume_ms[len(resume_ms) // 2]:.1f}"
        f" ms, max {resume_ms[-1]:.1f} ms over {len(resume_ms)} resumes"
    )


async def open_and_collect(url: str) -> StreamResult:
    result = StreamResult()
    async with connect(url) as ws:
        await asyncio.wait_for(receive_all(ws, result), 10)
    return result


async def test_resume_token_is_bound_to_its_meeting_and_participant(
    parley_server: ServerProcess,
) -> None:
    """A token used on another meeting or by another participant is refused with 4403; an
    unknown token with 4404."""
    first = await stream_pcm(
        parley_server.ws_url, "bound-a", clip(JFK).pcm16()[:64_000], participant="erin", speed=0
    )
    token = first.messages[0]["resume_token"]
    cases = [
        (stream_url(parley_server.ws_url, "bound-b", resume_token=token), 4403),
        (
            stream_url(parley_server.ws_url, "bound-a", resume_token=token, participant="mallory"),
            4403,
        ),
        (stream_url(parley_server.ws_url, "bound-a", resume_token="x" * 43), 4404),
    ]
    for url, code in cases:
        result = await open_and_collect(url)
        assert result.close_code == code, (url, result.messages)
        assert result.of_type("error")
    resumed = await stream_pcm(  # resume, send nothing more, stop: the replay comes back
        parley_server.ws_url,
        "bound-a",
        b"",
        participant=None,
        speed=0,
        resume_token=token,
        last_seq=0,
    )
    started = resumed.messages[0]
    assert started["type"] == "session.started" and started["participant"] == "erin"
    assert [f["utterance_id"] for f in resumed.finals] == [f["utterance_id"] for f in first.finals]


async def test_a_resend_from_1e308_closes_1007(parley_server: ServerProcess) -> None:
    """A resumed stream whose `resend` says `from: 1e308` is closed 1007 with an `error`
    (bad input), not 1011 (issue 44)."""
    meeting = f"resend-huge-{time.monotonic_ns()}"
    first = await stream_pcm(
        parley_server.ws_url, meeting, clip(JFK).pcm16()[:64_000], participant="erin", speed=0
    )
    url = stream_url(
        parley_server.ws_url, meeting, resume_token=first.messages[0]["resume_token"], last_seq=0
    )
    result = StreamResult()
    async with connect(url) as ws:
        receiver = asyncio.create_task(receive_all(ws, result))
        await result.wait_for(lambda r: bool(r.messages))
        await ws.send('{"type": "resend", "from": 1e308}')
        await asyncio.wait_for(receiver, 10)
    assert result.messages[0]["type"] == "session.started"
    assert result.close_code == 1007, (result.close_code, result.messages[-2:])
    assert [e["code"] for e in result.of_type("error")] == ["invalid_message"]


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"), persistent=True)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def on_own_redis(own_redis: RedisServer) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """Two servers on `own_redis`, their models loading side by side: the first is killed
    in one test, the second serves on in the next (one model load fewer than a server of
    its own)."""
    env = {"PARLEY_REDIS_URL": own_redis.url}
    servers = [start_server(env, wait=False) for _ in range(2)]
    try:
        for server in servers:
            server.wait_ready(START_TIMEOUT)
        yield servers[0], servers[1]
    finally:
        for server in servers:
            server.stop()


async def test_server_killed_mid_meeting_resumes_on_another(
    on_own_redis: tuple[ServerProcess, ServerProcess],
) -> None:
    """SIGKILL the server mid-meeting; the client resumes on a second server sharing the
    Redis; no acknowledged final is lost, and both servers serve the whole transcript."""
    first, second = on_own_redis
    speech = clip(LONG)
    base = await baseline(second, speech, 3.0)
    stream = ResumableStream(first.ws_url, "killed", speech.pcm16(), speed=3.0)
    # After the first final: the clip gives 2-3 finals, and waiting for the second
    # raced the end of the stream once the model got faster (the kill came after 1000).
    killer = asyncio.create_task(_kill_after_finals(first, stream, 1))
    with contextlib.suppress(ConnectionClosed):  # sending may or may not notice first
        await stream.run()
    await killer
    assert stream.connections[0].close_code == 1006  # died, no close handshake
    assert not stream.connections[0].of_type("session.ended")
    stream.base = second.ws_url
    await stream.run(resume=True)
    assert_same_transcript(stream.finals, base, speech)
    acknowledged = stream.connections[0].finals
    logged = orjson.loads(second.get("/v1/meetings/killed/transcript")[1])["finals"]
    assert [f["utterance_id"] for f in acknowledged] == [
        f["utterance_id"] for f in logged[: len(acknowledged)]
    ]
    assert [f["seq"] for f in logged] == list(range(1, len(logged) + 1))


async def _kill_after_finals(server: ServerProcess, stream: ResumableStream, n: int) -> None:
    await stream.connected.wait()
    await stream.connections[0].wait_for(lambda r: len(r.finals) >= n)
    server.process.kill()


async def test_redis_restart_mid_meeting(
    own_redis: RedisServer, on_own_redis: tuple[ServerProcess, ServerProcess]
) -> None:
    """Restart Redis while a meeting streams: no final lost, the meeting finishes, /readyz
    goes degraded and comes back."""
    _, server = on_own_redis  # the survivor of the test above, or a fresh one
    speech = clip(LONG)
    base = await baseline(server, speech, 1.0)
    task = asyncio.create_task(
        stream_pcm(server.ws_url, "redis-restart", speech.pcm16(), speed=1.0)
    )
    await asyncio.sleep(4.0)
    own_redis.kill()
    degraded = await _wait_readyz(server, lambda body: body["checks"]["store"] == "degraded")
    await asyncio.sleep(3.0)
    own_redis.start()
    recovered = await _wait_readyz(server, lambda body: body["status"] == "ready")
    result = await task
    assert degraded and recovered
    assert result.messages[-1]["type"] == "session.ended"
    assert_same_transcript(result.finals, base, speech)
    logged = orjson.loads(server.get("/v1/meetings/redis-restart/transcript")[1])["finals"]
    assert [f["utterance_id"] for f in logged] == [f["utterance_id"] for f in result.finals]


async def _wait_readyz(server: ServerProcess, check: Any, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, body = await asyncio.to_thread(server.get, "/readyz")
        if check(orjson.loads(body)):
            return True
        await asyncio.sleep(0.1)
    return False
