"""Latency of the store calls a session makes, MemoryStore vs RedisStore (not a test).

    python -m bench.store_latency [--redis-url redis://127.0.0.1:6379/0] [-n 2000]

Sequential calls from one task, as one session actor makes them; keys go under a
throwaway prefix that is deleted afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace

from redis.asyncio import Redis

from store.api import Store
from store.memory import MemoryStore
from store.records import NewFinal, SourceState
from store.redis.store import RedisStore


async def timed(n: int, call: Callable[[int], Awaitable[object]]) -> list[float]:
    samples = []
    for i in range(n):
        start = time.perf_counter()
        await call(i)
        samples.append(time.perf_counter() - start)
    return samples


def summary(samples: list[float]) -> str:
    ordered = sorted(samples)
    p50 = ordered[len(ordered) // 2]
    p99 = ordered[int(len(ordered) * 0.99)]
    return (
        f"p50 {p50 * 1e6:7.0f} µs   p99 {p99 * 1e6:7.0f} µs"
        f"   mean {statistics.fmean(samples) * 1e6:7.0f} µs"
    )


async def measure(store: Store, n: int) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {}
    states: list[SourceState] = []
    tokens: list[str] = []

    async def create(i: int) -> None:
        state, token = await store.create_source("bench", f"p{i}")
        states.append(state)
        tokens.append(token)

    results["create_source"] = await timed(200, create)
    state = states[0]

    async def append(i: int) -> None:
        nonlocal state
        final = NewFinal(
            utterance_id=f"{state.session_id}-{i}",
            session_id=state.session_id,
            participant=state.participant,
            text="the quick brown fox jumps over the lazy dog " * 2,
            start=i * 3.0,
            end=i * 3.0 + 2.5,
            language="en",
            words=[{"word": "the", "start": i * 3.0, "end": i * 3.0 + 0.2}] * 18,
        )
        after = replace(state, acked_until=final.end, next_utterance=i + 1, context="ctx " * 50)
        await store.append_final("bench", final, after)
        state = after

    results["append_final"] = await timed(n, append)

    async def publish(i: int) -> None:
        await store.publish("bench", b'{"type":"transcript.partial","text":"x"}')

    results["publish (no listener)"] = await timed(n, publish)

    async with store.subscribe("bench") as events:

        async def round_trip(i: int) -> None:
            await store.publish("bench", b"%d" % i)
            await anext(events)

        results["publish -> listener receives"] = await timed(n, round_trip)

    async def resume(i: int) -> None:
        await store.resume_source("bench", tokens[i % len(tokens)])

    results["resume_source"] = await timed(200, resume)

    async def replay(i: int) -> None:
        await store.finals("bench", after_seq=n - 50)

    results["finals(last 50)"] = await timed(200, replay)

    async def whole(i: int) -> None:
        await store.finals("bench")

    results[f"finals(all {n})"] = await timed(20, whole)
    return results


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("-n", type=int, default=2000)
    args = parser.parse_args()

    memory = MemoryStore()
    prefix = f"parley-bench:{uuid.uuid4().hex[:8]}:"
    redis = RedisStore.from_url(args.redis_url, prefix=prefix)
    try:
        stores: list[tuple[str, Store]] = [("memory", memory), ("redis", redis)]
        for name, store in stores:
            results = await measure(store, args.n)
            print(f"\n{name}")
            for call, samples in results.items():
                print(f"  {call:30s} {summary(samples)}")
    finally:
        await redis.close()
        await memory.close()
        client = Redis.from_url(args.redis_url)
        keys = [k async for k in client.scan_iter(match=prefix + "*", count=1000)]
        if keys:
            await client.delete(*keys)
        await client.aclose()


if __name__ == "__main__":
    asyncio.run(main())
