"""Authentication and limits as units: keys, meeting tokens, origins, tenancy, the
real-time budget, quotas, capacity, and a connection's idle and duration limits."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from engine.api import Priority, RecognitionRequest, RecognitionResult, Transcription, Utterance
from server.auth.keys import (
    ANONYMOUS,
    Authenticator,
    OriginPolicy,
    OwnerCheck,
    Principal,
    Scope,
    meeting_access,
    owned_config,
    parse_api_keys,
)
from server.auth.tokens import MemoryTokens, RedisTokens, TokenGrant, TokenQuotaExceeded
from server.limits import CapacityMonitor, LimitedConnection, RealtimeBudget, Slots
from server.logs import RedactTokens
from server.settings import Settings
from store.errors import StoreOverloaded
from store.memory import MemoryStore
from wire.codes import CloseCode
from wire.errors import ProtocolError

SOON_S = 2.0  # a token that expires during the test
KEY_A = "key-of-tenant-a-0123456789"
KEY_B = "key-of-tenant-b-0123456789"


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def authenticator(clock: Clock | None = None, **options: Any) -> Authenticator:
    keys = parse_api_keys(f"a:{KEY_A},b:{KEY_B}", None)
    options.setdefault("origins", OriginPolicy.from_setting(None, auth_enabled=True))
    return Authenticator(
        keys, MemoryTokens(clock=clock or Clock()), clock=clock or Clock(), **options
    )


def test_api_keys_parse_from_inline_and_file(tmp_path: Path) -> None:
    """Inline pairs and a file with comments load as digests; short keys, bad tenants and a
    key given to two tenants are refused without echoing the key."""
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"# ops keys\nc:{'k' * 20}  # rotated 2026-01\n\n")
    keys = parse_api_keys(f"a:{KEY_A}, a:{KEY_B}", str(keys_file))
    assert sorted(keys.values()) == ["a", "a", "c"]
    assert all(len(d) == 32 for d in keys)
    with pytest.raises(ValueError, match="under 16") as short:
        parse_api_keys("a:short", None)
    assert "short" not in str(short.value).replace("under 16", "")
    with pytest.raises(ValueError, match="tenant:key"):
        parse_api_keys(f"bad tenant:{KEY_A}", None)
    with pytest.raises(ValueError, match="two tenants"):
        parse_api_keys(f"a:{KEY_A},b:{KEY_A}", None)
    assert parse_api_keys(None, None) == {}


def test_settings_hide_keys_and_check_limits() -> None:
    """API keys never appear in the settings' repr; limits must be positive."""
    settings = Settings.from_env({"PARLEY_API_KEYS": f"a:{KEY_A}"})
    assert KEY_A not in repr(settings)
    with pytest.raises(ValueError, match="PARLEY_IDLE_TIMEOUT_S"):
        Settings.from_env({"PARLEY_IDLE_TIMEOUT_S": "0"})
    with pytest.raises(ValueError, match="PARLEY_MAX_STREAMS_PER_KEY"):
        Settings.from_env({"PARLEY_MAX_STREAMS_PER_KEY": "0"})
    with pytest.raises(ValueError, match="PARLEY_REALTIME_BURST_S"):
        Settings.from_env({"PARLEY_REALTIME_BURST_S": "nan"})


async def test_keys_resolve_to_tenants_and_tokens_are_single_use() -> None:
    """A key resolves to its tenant; a meeting token opens its meeting once, for its scope
    and before it expires; keys are refused outside the header."""
    clock = Clock()
    auth = authenticator(clock, fast_replay_tenants="b")
    assert auth.enabled and auth.key_tenant(KEY_A) == "a" and auth.key_tenant("x" * 20) is None
    a = await auth.resolve(KEY_A, "m1", Scope.STREAM, keys_allowed=True)
    assert a == Principal("a", fast_replay=False)
    assert (await auth.resolve(KEY_B, "m1", Scope.STREAM, keys_allowed=True)).fast_replay
    with pytest.raises(ProtocolError) as in_url:
        await auth.resolve(KEY_A, "m1", Scope.STREAM, keys_allowed=False)
    assert in_url.value.close_code == CloseCode.UNAUTHORIZED

    token, expires_at = await auth.mint(a, "m1", scope=Scope.STREAM, participant="ana")
    assert expires_at == clock.now + 60
    got = await auth.resolve(token, "m1", Scope.STREAM, keys_allowed=False)
    assert got == Principal("a", fast_replay=False, via_token=True, participant="ana")
    with pytest.raises(ProtocolError) as reused:
        await auth.resolve(token, "m1", Scope.STREAM, keys_allowed=False)
    assert reused.value.close_code == CloseCode.UNAUTHORIZED
    elsewhere, _ = await auth.mint(a, "m1")
    with pytest.raises(ProtocolError) as wrong_meeting:
        await auth.resolve(elsewhere, "m2", Scope.STREAM, keys_allowed=False)
    assert wrong_meeting.value.close_code == CloseCode.FORBIDDEN
    listen_only, _ = await auth.mint(a, "m1", scope=Scope.EVENTS)
    with pytest.raises(ProtocolError) as wrong_scope:
        await auth.resolve(listen_only, "m1", Scope.STREAM, keys_allowed=False)
    assert wrong_scope.value.close_code == CloseCode.FORBIDDEN
    short, _ = await auth.mint(a, "m1", ttl_s=1.0)
    clock.now += 1.0
    with pytest.raises(ProtocolError) as expired:
        await auth.resolve(short, "m1", Scope.STREAM, keys_allowed=False)
    assert expired.value.close_code == CloseCode.UNAUTHORIZED
    _, capped = await auth.mint(a, "m1", ttl_s=3600)
    assert capped == clock.now + 60


async def test_authentication_is_off_without_keys() -> None:
    """No keys: every credential (or none) is the anonymous principal, who may replay fast."""
    auth = Authenticator(
        {}, MemoryTokens(), origins=OriginPolicy.from_setting(None, auth_enabled=False)
    )
    assert not auth.enabled
    assert await auth.resolve("anything", "m", Scope.STREAM, keys_allowed=False) is ANONYMOUS
    assert auth.key_principal(None) is ANONYMOUS


def test_origin_policy() -> None:
    """No Origin passes; same origin passes; others pass only when listed (or `*`)."""
    strict = OriginPolicy.from_setting(None, auth_enabled=True)
    assert strict.allows(None, "parley.example:8000")
    assert strict.allows("https://parley.example:8000", "parley.example:8000")
    assert not strict.allows("https://evil.example", "parley.example:8000")
    assert not strict.allows("null", "parley.example:8000")
    listed = OriginPolicy.from_setting("https://app.example/, https://b.example", auth_enabled=True)
    assert listed.allows("https://APP.example", "parley.example")
    assert not listed.allows("https://app.example.evil", "parley.example")
    assert OriginPolicy.from_setting("*", auth_enabled=True).allows("https://x", None)
    assert OriginPolicy.from_setting("*", auth_enabled=False).allows("https://x", None)


def test_origin_policy_with_authentication_off() -> None:
    """Authentication off, nothing configured: pages on loopback hosts and the server's
    own origin by address pass; a page on the web does not, not even one whose name was
    rebound to the server's address (same origin by name)."""
    local = OriginPolicy.from_setting(None, auth_enabled=False)
    for page in ("http://localhost:5173", "http://127.0.0.1:3000", "http://[::1]:8080",
                 "http://app.localhost"):  # fmt: skip
        assert local.allows(page, "127.0.0.1:8000"), page
    assert local.allows("http://192.168.1.5:8000", "192.168.1.5:8000")  # own page on the LAN
    assert not local.allows("https://evil.example", "127.0.0.1:8000")
    assert not local.allows("http://rebound.evil.example:8000", "rebound.evil.example:8000")
    assert not local.allows("http://127.0.0.1.evil.example", "127.0.0.1:8000")
    assert not local.allows("null", "127.0.0.1:8000")
    widened = OriginPolicy.from_setting("http://dev.example:8000", auth_enabled=False)
    assert widened.allows("http://dev.example:8000", "dev.example:8000")


async def test_memory_tokens_are_bounded() -> None:
    """A full token table drops expired grants first, then refuses to mint."""
    clock = Clock()
    tokens = MemoryTokens(limit=2, clock=clock)
    grant = TokenGrant("a", "m", None, None, expires_at=clock.now + 1)
    await tokens.put("d1", grant, 1)
    await tokens.put("d2", grant, 1)
    with pytest.raises(StoreOverloaded):
        await tokens.put("d3", grant, 1)
    clock.now += 2
    await tokens.put("d3", TokenGrant("a", "m", None, None, clock.now + 1), 1)
    assert len(tokens) == 1


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_a_tenant_holds_at_most_its_quota_of_tokens(
    backend: str, redis_url: str, redis_prefix: str
) -> None:
    """Each tenant may hold `per_tenant` unspent tokens: the next is refused
    (TokenQuotaExceeded) without touching other tenants; spending or expiry frees room."""
    tokens = (
        MemoryTokens(per_tenant=2)
        if backend == "memory"
        else RedisTokens.from_url(redis_url, redis_prefix, per_tenant=2)
    )
    try:
        # a1 must outlive the quota checks below (a few Redis round trips; a loaded CI run
        # has taken ~0.5 s for two), then expire: room again once it has, not before.
        soon = TokenGrant("a", "m", None, None, expires_at=time.time() + SOON_S)
        later = TokenGrant("a", "m", None, None, expires_at=time.time() + 60)
        await tokens.put("a1", soon, SOON_S)
        await tokens.put("a2", later, 60)
        with pytest.raises(TokenQuotaExceeded):
            await tokens.put("a3", later, 60)
        await tokens.put("b1", TokenGrant("b", "m", None, None, time.time() + 60), 60)
        assert await tokens.take("a2") == later
        await tokens.put("a3", later, 60)  # spent: room again
        with pytest.raises(TokenQuotaExceeded):
            await tokens.put("a4", later, 60)
        assert time.time() < soon.expires_at, "too slow: a1 expired during the quota checks"
        async with asyncio.timeout(SOON_S + 10):  # a1 expired unspent: room again
            while True:
                try:
                    await tokens.put("a4", later, 60)
                    break
                except TokenQuotaExceeded:
                    await asyncio.sleep(0.05)
        assert time.time() >= soon.expires_at - 0.01  # not before a1 expired
    finally:
        await tokens.close()


async def test_redis_tokens_are_spent_once_across_nodes(redis_url: str, redis_prefix: str) -> None:
    """Two nodes share Redis: a token minted on one is spent on the other, then never again."""
    minting, spending = (RedisTokens.from_url(redis_url, redis_prefix) for _ in range(2))
    try:
        grant = TokenGrant("a", "m", "stream", "ana", expires_at=4e9)
        await minting.put("digest", grant, 5.0)
        results = await asyncio.gather(*(spending.take("digest") for _ in range(5)))
        assert [r for r in results if r is not None] == [grant]
        assert await minting.take("digest") is None
    finally:
        await minting.close()
        await spending.close()


async def test_tenancy_follows_the_meeting_owner() -> None:
    """A new meeting is its creator's (first writer wins); other tenants, and every tenant
    for a meeting created without an owner, are refused 4403; anonymous passes."""
    store = MemoryStore()
    a, b = Principal("a", False), Principal("b", False)
    assert await meeting_access(store, "m1", a) is False
    await store.create_source("m1", "p", owned_config({"language": "en"}, a))
    await store.create_source("m1", "p", owned_config({"language": "en"}, b))  # too late
    assert await meeting_access(store, "m1", a) is True
    with pytest.raises(ProtocolError) as other:
        await meeting_access(store, "m1", b)
    assert other.value.close_code == CloseCode.FORBIDDEN
    await store.create_source("legacy", "p", {"language": "en"})
    with pytest.raises(ProtocolError):
        await meeting_access(store, "legacy", a)
    assert await meeting_access(store, "m1", ANONYMOUS) is True


async def test_owner_check_refuses_a_meeting_another_tenant_creates_later() -> None:
    """A listener may wait on a meeting that does not exist; if another tenant creates it,
    the first confirm() refuses before anything is sent."""
    store = MemoryStore()
    clock = Clock()
    waiting = OwnerCheck(store, "later", Principal("a", False), clock)
    await waiting.start()
    await store.create_source("later", "p", owned_config({}, Principal("b", False)))
    with pytest.raises(ProtocolError) as refused:
        await waiting.confirm()
    assert refused.value.close_code == CloseCode.FORBIDDEN
    mine = OwnerCheck(store, "later", Principal("b", False), clock)
    await mine.start()
    await mine.confirm()


def test_realtime_budget_paces_past_the_burst() -> None:
    """Audio within the burst passes at once; beyond it, the wait keeps the average at
    `factor` × real time."""
    budget = RealtimeBudget(factor=2.0, burst_s=4.0, now=0.0)
    assert budget.spend(4.0, now=0.0) == 0.0
    assert budget.spend(1.0, now=0.0) == pytest.approx(0.5)
    assert budget.spend(1.0, now=0.5) == pytest.approx(0.5)  # refilled 1.0, spent 1.0, owes 1.0
    assert budget.spend(0.5, now=10.0) == 0.0  # refilled to the burst


def test_slots_count_per_key() -> None:
    """A key holds at most `limit` slots; releasing frees one."""
    slots = Slots(2)
    assert slots.acquire("a") and slots.acquire("a") and not slots.acquire("a")
    assert slots.acquire("b")
    slots.release("a")
    assert slots.acquire("a") and slots.held("a") == 2


def _result(wait: float, inference: float = 0.1) -> RecognitionResult:
    return RecognitionResult(Transcription("x", "en", -0.1, 0.0), wait, inference, 1)


def _request(priority: Priority) -> RecognitionRequest:
    import numpy as np

    return RecognitionRequest("s", priority, Utterance(np.zeros(16, dtype=np.float32), "en"))


def test_capacity_monitor_refuses_while_finals_wait_too_long() -> None:
    """Slow finals in the window refuse new streams, one slow outlier and slow partials
    do not; the refusal lifts once the slow finals leave the window."""
    clock = Clock(0.0)
    monitor = CapacityMonitor(0.5, max_batch_size=4, window_s=10.0, clock=clock)
    monitor.observe_batch([_request(Priority.PARTIAL)] * 6, [_result(5.0)] * 6)
    assert monitor.refusal(None) is None
    monitor.observe_batch([_request(Priority.FINAL)] * 3, [_result(9.0)] * 3)
    assert monitor.refusal(None) is None  # too few finals to judge
    monitor.observe_batch([_request(Priority.FINAL)] * 4, [_result(0.1)] * 4)
    assert monitor.refusal(None) is None  # median 0.1 s: outliers
    monitor.observe_batch([_request(Priority.FINAL)] * 4, [_result(0.9)] * 4)
    reason = monitor.refusal(None)
    assert reason is not None and "900 ms" in reason
    assert 0 < monitor.utilisation() <= 1
    clock.now += 11
    assert monitor.refusal(None) is None
    assert CapacityMonitor(0.0, 4).refusal(None) is None  # 0: off


class FakeSocket:
    """Frames queued by the test; receive() waits for the next one."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def receive(self) -> dict[str, Any]:
        return await self.inbox.get()

    async def send_text(self, data: str) -> None:
        return None

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        return None


async def test_connection_limits_idle_and_duration() -> None:
    """receive() raises 4408 after the idle timeout and 4413 at the maximum duration, even
    for a client that never stops sending."""
    socket = FakeSocket()
    idle = LimitedConnection(
        socket, idle_timeout_s=0.05, max_duration_s=60, budget=None, bytes_per_second=32000
    )
    with pytest.raises(ProtocolError) as timed_out:
        await idle.receive()
    assert timed_out.value.close_code == CloseCode.TIMEOUT
    clock = Clock(0.0)
    busy = LimitedConnection(
        socket,
        idle_timeout_s=10,
        max_duration_s=5,
        budget=None,
        bytes_per_second=32000,
        clock=clock,
    )
    socket.inbox.put_nowait({"type": "websocket.receive", "bytes": b"\0\0"})
    assert (await busy.receive())["bytes"] == b"\0\0"
    clock.now = 5.0
    socket.inbox.put_nowait({"type": "websocket.receive", "bytes": b"\0\0"})
    with pytest.raises(ProtocolError) as too_long:
        await busy.receive()
    assert too_long.value.close_code == CloseCode.MAX_DURATION


async def test_connection_paces_audio_beyond_the_budget() -> None:
    """With a budget, a burst of audio past it is read at the real-time factor."""
    socket = FakeSocket()
    paced_for = [0.0]  # the time the pacing meant to take: the delays it asked for

    class Recorded(RealtimeBudget):
        def spend(self, audio_s: float, now: float) -> float:
            delay = super().spend(audio_s, now)
            paced_for[0] += delay
            return delay

    # The connection's clock is the pacing's own time, so a loaded machine oversleeping
    # (which refills the bucket) cannot change the schedule; the sleeps are still real.
    paced = LimitedConnection(
        socket,
        idle_timeout_s=10,
        max_duration_s=60,
        budget=Recorded(factor=10.0, burst_s=0.1, now=0.0),
        bytes_per_second=32000,
        clock=lambda: paced_for[0],
    )
    for _ in range(5):
        socket.inbox.put_nowait({"type": "websocket.receive", "bytes": bytes(3200)})  # 0.1 s
    loop = asyncio.get_running_loop()
    started = loop.time()
    for _ in range(5):
        await paced.receive()
    assert paced_for[0] == pytest.approx(0.04, abs=1e-9)  # 0.4 s of audio past the burst at 10x
    assert loop.time() - started >= 0.04 - 0.005  # slept it (asyncio wakes up to 1 ms early)


def test_logs_redact_tokens_in_query_strings() -> None:
    """access_token and resume_token values never reach the log output."""
    record = logging.LogRecord(
        "uvicorn.error",
        logging.INFO,
        "",
        0,
        '%s - "WebSocket %s" [accepted]',
        ("127.0.0.1:5", "/v1/meetings/m/stream?access_token=pmt_abc-_9&resume_token=xyz&a=1"),
        None,
    )
    RedactTokens().filter(record)
    line = record.getMessage()
    assert "pmt_abc" not in line and "xyz" not in line and "a=1" in line
