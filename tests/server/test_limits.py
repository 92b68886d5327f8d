"""Limits on the in-process app: streams per key, listeners per meeting, idle timeout,
maximum duration, real-time pacing, and a listener that stops reading."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable

import orjson
import pytest
from websockets.asyncio.client import connect

from server.limits import ALL, Turns
from tests.support.appserver import AppServer, serve_app
from tests.support.corpus import clip
from tests.support.hardclient import STOP, bearer, error_of, exchange
from tests.support.wsclient import StreamResult, receive_all
from wire.codes import ErrorCode
from wire.errors import ProtocolError

FAST = "fast-tenant-key-0123456789"
SLOW = "slow-tenant-key-0123456789"
KEEPALIVE = orjson.dumps({"type": "keepalive"}).decode()


@pytest.fixture(scope="module")
async def limited() -> AsyncIterator[AppServer]:
    """Authentication on (a fast-replay tenant and a paced one) and tight limits."""
    async with serve_app(
        api_keys=f"fast:{FAST},slow:{SLOW}",
        fast_replay_tenants="fast",
        max_streams_per_key=2,
        max_listeners_per_meeting=2,
        idle_timeout_s=1.0,
        max_session_s=2.5,
        realtime_factor=4.0,
        realtime_burst_s=1.0,
        listener_send_timeout_s=0.5,
        max_waiting_auth=2,
        max_listeners_per_tenant=3,
        max_listeners=4,
        max_tokens_per_tenant=2,
    ) as server:
        yield server


def speech(seconds: float, frame_s: float = 0.2) -> list[bytes | str]:
    pcm = clip("en_jfk").pcm16()[: int(seconds * 32000)]
    step = int(frame_s * 32000)
    return [pcm[o : o + step] for o in range(0, len(pcm), step)]


async def test_streams_per_key_are_capped(limited: AppServer) -> None:
    """A tenant's third concurrent stream is refused 4429 with retry_after; another tenant
    is not affected, and a slot frees when a stream ends."""
    url = f"{limited.ws_url}/v1/meetings/quota/stream"
    async with (
        connect(url, additional_headers=bearer(FAST)) as one,
        connect(url, additional_headers=bearer(FAST)) as two,
    ):
        await one.recv()
        await two.recv()
        third = await exchange(url, headers=bearer(FAST))
        assert third.close_code == 4429
        error = error_of(third)
        assert error is not None and error["code"] == "quota_exceeded" and error["retry_after"] > 0
        other = await exchange(
            f"{limited.ws_url}/v1/meetings/other/stream", [STOP], headers=bearer(SLOW)
        )
        assert other.close_code == 1000
    again = await exchange(url, [STOP], headers=bearer(FAST))
    assert again.close_code == 1000


async def test_listeners_per_meeting_are_capped(limited: AppServer) -> None:
    """The third listener of a meeting is refused 4429; other meetings are not affected."""
    created = await exchange(
        f"{limited.ws_url}/v1/meetings/crowd/stream", [STOP], headers=bearer(FAST)
    )
    assert created.close_code == 1000
    url = f"{limited.ws_url}/v1/meetings/crowd/events"
    async with (
        connect(url, additional_headers=bearer(FAST)),
        connect(url, additional_headers=bearer(FAST)),
    ):
        while limited.state.listener_slots.held("crowd") < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        third = await exchange(url, headers=bearer(FAST))
        assert third.close_code == 4429 and error_of(third)["code"] == "quota_exceeded"  # type: ignore[index]


async def test_idle_stream_is_closed_after_its_finals(limited: AppServer) -> None:
    """Speech, then nothing: the utterance in progress is finalized and sent, then error
    `timeout` and close 4408."""
    started = time.monotonic()
    result = await exchange(
        f"{limited.ws_url}/v1/meetings/idle/stream", speech(2.0), headers=bearer(FAST)
    )
    assert result.close_code == 4408
    kinds = [m["type"] for m in result.messages]
    assert "transcript.final" in kinds and kinds[-1] == "error"
    assert result.messages[-1]["code"] == "timeout"
    assert 1.0 <= time.monotonic() - started < 5


async def test_keepalives_hold_a_stream_until_its_maximum_duration(limited: AppServer) -> None:
    """Keepalives keep a quiet stream open past the idle timeout; at the maximum duration
    its finals are flushed, then error `max_duration` and close 4413."""
    url = f"{limited.ws_url}/v1/meetings/long/stream"
    result = StreamResult()
    started = time.monotonic()
    async with connect(url, additional_headers=bearer(FAST)) as ws:
        receiver = asyncio.create_task(receive_all(ws, result))
        for frame in speech(1.5):
            await ws.send(frame)
        while not receiver.done():
            await ws.send(KEEPALIVE)
            await asyncio.wait({receiver}, timeout=0.3)
    assert result.close_code == 4413
    assert 2.5 <= time.monotonic() - started < 6
    assert result.finals and result.messages[-1]["code"] == "max_duration"
    assert result.finals[-1]["end"] <= 1.5


async def test_audio_faster_than_real_time_is_paced_unless_allowed(limited: AppServer) -> None:
    """Five seconds of audio sent at once: read at 4x real time after a 1 s burst for a
    paced tenant (>= 1 s), at once for a fast-replay tenant."""

    async def replay(key: str) -> float:
        started = time.monotonic()
        result = await exchange(
            f"{limited.ws_url}/v1/meetings/replay-{key[:4]}/stream",
            [*speech(5.0, frame_s=0.1), STOP],
            headers=bearer(key),
        )
        assert result.close_code == 1000 and result.messages[-1]["type"] == "session.ended"
        assert result.messages[-1]["audio_seconds"] == pytest.approx(5.0, abs=0.01)
        return time.monotonic() - started

    paced, fast = await asyncio.gather(replay(SLOW), replay(FAST))
    assert paced >= (5.0 - 1.0) / 4.0 - 0.05, paced
    assert fast < paced / 2, (fast, paced)


async def test_a_listener_that_stops_reading_is_dropped(limited: AppServer) -> None:
    """A listener that reads nothing is dropped within the send timeout while a reading
    listener receives every event; publishing never waits for the slow one."""
    created = await exchange(
        f"{limited.ws_url}/v1/meetings/flood/stream", [STOP], headers=bearer(FAST)
    )
    assert created.close_code == 1000
    url = f"{limited.ws_url}/v1/meetings/flood/events"
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", limited.port))
    sock.setblocking(False)
    healthy = StreamResult()
    store = limited.state.store
    events = 400
    async with (
        connect(url, additional_headers=bearer(FAST), sock=sock, max_queue=1) as stalled,
        connect(url, additional_headers=bearer(FAST), max_size=None) as reader,
    ):
        receiving = asyncio.create_task(receive_all(reader, healthy))
        while limited.state.listener_slots.held("flood") < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        started = time.monotonic()
        for i in range(events):
            event = {"type": "transcript.partial", "utterance_id": f"u-{i}", "text": "x" * 8000}
            await store.publish("flood", orjson.dumps(event))
            await asyncio.sleep(0)
        publishing = time.monotonic() - started
        await healthy.wait_for(lambda r: len(r.messages) >= events)
        deadline = time.monotonic() + 5
        while limited.state.listener_slots.held("flood") > 1:
            assert time.monotonic() < deadline, "the stalled listener was not dropped"
            await asyncio.sleep(0.05)
        assert [m["utterance_id"] for m in healthy.messages] == [f"u-{i}" for i in range(events)]
        assert publishing < 2.0
        stalled_result = StreamResult()
        await asyncio.wait_for(receive_all(stalled, stalled_result), 10)
        assert len(stalled_result.messages) < events
        assert stalled_result.close_code == 1008  # after what it had buffered
        assert stalled_result.messages[-1]["code"] == "slow_consumer"
        receiving.cancel()


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - the server's counters have no events
            await asyncio.sleep(0.01)


async def test_sockets_waiting_to_authenticate_are_capped(limited: AppServer) -> None:
    """Sockets that bring no credentials are accepted to wait for an `auth` message; past
    PARLEY_MAX_WAITING_AUTH of them a new one is refused 1013 at once, a socket with a key
    is not affected, and a waiting socket that leaves frees its place."""
    url = f"{limited.ws_url}/v1/meetings/waiting/stream"
    waiting = limited.state.waiting_auth
    async with connect(url), connect(url):
        await until(lambda: waiting.held(ALL) == 2)
        third = await exchange(url, [STOP], timeout=5)
        assert third.close_code == 1013, third.messages
        assert error_of(third)["code"] == "overloaded"  # type: ignore[index]
        keyed = await exchange(url, [STOP], headers=bearer(FAST))
        assert keyed.close_code == 1000
    await until(lambda: waiting.held(ALL) == 0)
    auth = orjson.dumps({"type": "auth", "token": FAST}).decode()
    late = await exchange(url, [auth, STOP])
    assert late.close_code == 1000, late.messages


async def test_listeners_are_capped_per_tenant_and_in_all(limited: AppServer) -> None:
    """A tenant's fourth listener (over three meetings) is refused 4429; the server's fifth
    listener in all is refused 1013, whoever asks."""
    for meeting, key in (("l1", FAST), ("l2", FAST), ("l3", FAST), ("l4", SLOW)):
        created = await exchange(
            f"{limited.ws_url}/v1/meetings/{meeting}/stream", [STOP], headers=bearer(key)
        )
        assert created.close_code == 1000

    def events(meeting: str) -> str:
        return f"{limited.ws_url}/v1/meetings/{meeting}/events"

    total = limited.state.listener_slots.total
    async with (
        connect(events("l1"), additional_headers=bearer(FAST)),
        connect(events("l1"), additional_headers=bearer(FAST)),
        connect(events("l2"), additional_headers=bearer(FAST)),
    ):
        await until(lambda: total.held(ALL) == 3)
        fourth = await exchange(events("l3"), headers=bearer(FAST), timeout=10)
        assert fourth.close_code == 4429, fourth.messages
        assert "tenant" in error_of(fourth)["message"]  # type: ignore[index]
        async with connect(events("l4"), additional_headers=bearer(SLOW)):
            await until(lambda: total.held(ALL) == 4)
            fifth = await exchange(events("l4"), headers=bearer(SLOW), timeout=10)
            assert fifth.close_code == 1013, fifth.messages
            assert error_of(fifth)["code"] == "overloaded"  # type: ignore[index]
    await until(lambda: total.held(ALL) == 0)


async def test_a_tenant_holds_at_most_its_share_of_meeting_tokens(limited: AppServer) -> None:
    """With PARLEY_MAX_TOKENS_PER_TENANT=2 a tenant's third unspent token is refused 429
    (Retry-After); another tenant still mints; spending a token frees its place."""

    async def mint(key: str) -> tuple[int, dict[str, str], bytes]:
        return await limited.request(
            "POST", "/v1/meetings/tokens-share/tokens", body={}, headers=bearer(key)
        )

    minted = [await mint(FAST) for _ in range(2)]
    assert [status for status, _, _ in minted] == [201, 201]
    status, headers, body = await mint(FAST)
    assert status == 429 and {k.lower(): v for k, v in headers.items()}["retry-after"], body
    assert orjson.loads(body)["error"]["code"] == "quota_exceeded"
    assert (await mint(SLOW))[0] == 201
    token = orjson.loads(minted[0][2])["token"]
    spent = await exchange(
        f"{limited.ws_url}/v1/meetings/tokens-share/events?access_token={token}", linger=0.2
    )
    assert spent.close_code != 4401, spent.messages
    assert (await mint(FAST))[0] == 201


async def test_turns_let_a_few_run_a_few_wait_and_refuse_the_rest() -> None:
    """`Turns(limit 1, 1 waiting, 0.3 s)`: the second caller waits and runs when the first
    ends; a third while one waits is `overloaded` at once; a waiter past 0.3 s too."""
    turns = Turns("enrollments", 1, 1, 0.3)
    order: list[str] = []
    release = asyncio.Event()

    async def hold(name: str) -> None:
        async with turns.turn():
            order.append(name)
            await release.wait()

    first = asyncio.create_task(hold("first"))
    await asyncio.sleep(0)
    second = asyncio.create_task(hold("second"))
    await asyncio.sleep(0)
    assert (turns.held, turns.waiting) == (1, 1)
    with pytest.raises(ProtocolError) as full:
        await hold("third")
    assert full.value.code is ErrorCode.OVERLOADED and full.value.retry_after
    release.set()
    await asyncio.gather(first, second)
    assert order == ["first", "second"] and (turns.held, turns.waiting) == (0, 0)

    release.clear()
    first = asyncio.create_task(hold("first"))
    await asyncio.sleep(0)
    began = time.monotonic()
    with pytest.raises(ProtocolError) as late:
        await hold("late")
    assert late.value.code is ErrorCode.OVERLOADED
    assert 0.25 <= time.monotonic() - began < 5
    assert (turns.held, turns.waiting) == (1, 0)
    release.set()
    await first
    async with turns.turn():  # the timed-out waiter took no turn with it
        assert turns.held == 1
