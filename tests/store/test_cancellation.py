"""Cancellation safety: store calls cancelled at random points, many times over, never
hand one meeting's data to another (the redis-py bug behind CVE-2023-28858/28859 did:
a cancelled command left its reply on a pooled connection for the next caller)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine
from typing import Any

import orjson

from store.api import Store
from store.errors import StoreError
from store.records import NewFinal, SourceState
from tests.conftest import StoreFactory
from tests.support.appserver import serve_app
from tests.support.corpus import clip
from tests.support.hardclient import STOP, exchange
from tests.support.wsclient import StreamResult

MEETINGS = [f"cancel-{i}" for i in range(5)]
ROUNDS = 150


async def _fill(store: Store) -> dict[str, tuple[SourceState, str]]:
    sources = {}
    for meeting in MEETINGS:
        source, token = await store.create_source(meeting, f"p-{meeting}", {"owner": meeting})
        for k in range(4):
            final = NewFinal(
                utterance_id=f"{source.session_id}-{k}",
                session_id=source.session_id,
                participant=source.participant,
                text=f"secret of {meeting} #{k}",
                start=float(k),
                end=k + 0.5,
                language="en",
            )
            source = SourceState(
                meeting, source.session_id, source.participant, source.generation, k + 0.5, k + 1
            )
            await store.append_final(meeting, final, source)
        sources[meeting] = (source, token)
    return sources


async def test_cancelled_store_calls_never_cross_meetings(make_store: StoreFactory) -> None:
    """150 rounds of concurrent reads, resumes and subscriptions on five meetings, a random
    half cancelled at a random point: every call that completes returns its own meeting's
    data, and every listener gets only its meeting's events."""
    store = make_store()
    sources = await _fill(store)
    rng = random.Random(8)
    checked = cancelled = 0
    received: dict[str, list[bytes]] = {m: [] for m in MEETINGS}

    async def listen(meeting: str, ready: asyncio.Event) -> None:
        async with store.subscribe(meeting) as events:
            ready.set()
            async for event in events:
                received[meeting].append(event)

    listeners = []
    for meeting in MEETINGS:
        ready = asyncio.Event()
        listeners.append(asyncio.create_task(listen(meeting, ready)))
        await ready.wait()

    def call(meeting: str) -> tuple[str, Callable[[], Coroutine[Any, Any, Any]]]:
        kind = rng.choice(["finals", "last_seq", "config", "resume", "subscribe", "publish"])
        if kind == "finals":
            return kind, lambda: store.finals(meeting, rng.randrange(3))
        if kind == "last_seq":
            return kind, lambda: store.last_seq(meeting)
        if kind == "config":
            return kind, lambda: store.meeting_config(meeting)
        if kind == "resume":
            return kind, lambda: store.resume_source(meeting, sources[meeting][1])
        if kind == "subscribe":

            async def brief() -> str:
                async with store.subscribe(meeting):
                    await asyncio.sleep(0)
                return meeting

            return kind, brief
        payload = orjson.dumps({"type": "transcript.partial", "meeting": meeting})
        return kind, lambda: store.publish(meeting, payload)

    for _ in range(ROUNDS):
        plans = [(m, *call(m)) for m in rng.choices(MEETINGS, k=12)]
        tasks = [asyncio.create_task(fn()) for _, _, fn in plans]
        for task in tasks:
            if rng.random() < 0.5:  # before it starts, between two awaits, or mid-reply
                await asyncio.sleep(rng.choice([0, 0, 0.0002, 0.0005, 0.001]))
                task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for (meeting, kind, _), result in zip(plans, results, strict=True):
            if isinstance(result, asyncio.CancelledError | StoreError):
                cancelled += 1
                continue
            assert not isinstance(result, BaseException), (kind, result)
            checked += 1
            if kind == "finals":
                assert all(f"secret of {meeting} #" in f.text for f in result), (meeting, result)
            elif kind == "last_seq":
                assert result == 4
            elif kind == "config":
                assert result == {"owner": meeting}
            elif kind == "resume":
                assert result.meeting_id == meeting
                assert result.session_id == sources[meeting][0].session_id
            elif kind == "subscribe":
                assert result == meeting
    await asyncio.sleep(0.2)  # let the last published events arrive
    for task in listeners:
        task.cancel()
    await asyncio.gather(*listeners, return_exceptions=True)
    for meeting, events in received.items():
        assert events, meeting
        assert all(orjson.loads(e)["meeting"] == meeting for e in events), meeting
    assert checked > ROUNDS * 3 and cancelled > 0, (checked, cancelled)
    # After all that, the store still answers each meeting correctly.
    for meeting in MEETINGS:
        assert [f.seq for f in await store.finals(meeting)] == [1, 2, 3, 4]


async def test_listeners_dropped_mid_read_never_get_another_meeting(
    redis_url: str, redis_prefix: str
) -> None:
    """On the Redis store, 120 listeners of three meetings hang up a few milliseconds in
    (cancelling the server's store calls mid-flight) while others read: each complete
    listener gets exactly its own meeting's finals."""
    async with serve_app(redis_url=redis_url, store_prefix=redis_prefix) as server:
        pcm = clip("en_jfk").pcm16()
        frames: list[bytes | str] = [pcm[o : o + 6400] for o in range(0, len(pcm), 6400)]
        streams = await asyncio.gather(
            *(
                exchange(
                    f"{server.ws_url}/v1/meetings/{m}/stream?participant=p-{m}", [*frames, STOP]
                )
                for m in MEETINGS[:3]
            )
        )
        expected = {
            m: [f["utterance_id"] for f in s.finals]
            for m, s in zip(MEETINGS, streams, strict=False)
        }
        rng = random.Random(3)

        async def hang_up(meeting: str) -> None:
            url = f"{server.ws_url}/v1/meetings/{meeting}/events?after_seq={rng.randrange(3)}"
            await exchange(url, linger=rng.random() * 0.005)

        async def read(meeting: str) -> StreamResult:
            return await exchange(  # the replay, however long it takes, then 0.3 s for extras
                f"{server.ws_url}/v1/meetings/{meeting}/events",
                until=lambda r: len(r.finals) >= len(expected[meeting]),
                linger=0.3,
            )

        for _ in range(4):
            batch = [hang_up(rng.choice(MEETINGS[:3])) for _ in range(30)]
            readers = {m: read(m) for m in MEETINGS[:3]}
            outcomes = await asyncio.gather(*readers.values(), *batch)
            for meeting, result in zip(readers, outcomes, strict=False):
                assert result is not None  # readers come first; hang_ups return None
                assert [f["utterance_id"] for f in result.finals] == expected[meeting]
                assert {f["participant"] for f in result.finals} == {f"p-{meeting}"}
