"""Speaker labels that re-clustering gave diarized finals after they were logged, as
the Redis store keeps them: field `sp:{utterance id}` of the meeting's `src` hash (which
carries the meeting's TTL), applied to the finals as they are read."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from redis.asyncio import Redis

from store.records import FinalRecord


async def write_speakers(redis: Redis, src: str, speakers: Mapping[str, str]) -> None:
    """Keep utterance id → speaker (HSET keeps the hash's TTL)."""
    await redis.hset(src, mapping={f"sp:{u}": speaker for u, speaker in speakers.items()})


async def relabelled(redis: Redis, src: str, records: list[FinalRecord]) -> list[FinalRecord]:
    """`records` with the latest speakers of their diarized finals."""
    diarized = [r for r in records if r.speaker is not None]
    if not diarized:
        return records
    labels: Any = await redis.hmget(src, [f"sp:{r.utterance_id}" for r in diarized])
    changed = {
        r.utterance_id: label.decode()
        for r, label in zip(diarized, labels, strict=True)
        if label is not None and label.decode() != r.speaker
    }
    if not changed:
        return records
    return [
        replace(r, speaker=changed[r.utterance_id]) if r.utterance_id in changed else r
        for r in records
    ]
