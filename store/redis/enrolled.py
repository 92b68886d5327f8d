"""Enrolled speakers in Redis (the `SpeakerBook` of store/enrolled.py), shared by every node.

    {prefix}speakers:{book}        hash: speaker id → the record's JSON (with its embedding)
    {prefix}speakers:{book}:names  hash: folded name → speaker id (names unique per tenant)

`{book}` is the tenant (store/enrolled.py `book_of`). No TTL: a speaker stays until
deleted. Adding and deleting are Lua scripts, so the bound and the name index hold
under concurrent calls from several nodes.
"""

from __future__ import annotations

from typing import Any

import orjson
from redis.asyncio import Redis

from store.enrolled import EnrolledSpeaker, SpeakerBookFull, SpeakerNameTaken, book_of
from store.redis.link import UNREACHABLE, Link

# KEYS: book, names. ARGV: id, folded name, record JSON, limit.
# Returns 1 (added), 0 (book full), -1 (name taken).
LUA_ADD = """
if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 1 then return -1 end
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[4]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[1])
return 1
"""

# KEYS: book, names. ARGV: id. Returns 1 (deleted) or 0 (no such speaker).
LUA_DELETE = """
local record = redis.call('HGET', KEYS[1], ARGV[1])
if not record then return 0 end
local folded = cjson.decode(record)['folded']
redis.call('HDEL', KEYS[1], ARGV[1])
if folded and redis.call('HGET', KEYS[2], folded) == ARGV[1] then
  redis.call('HDEL', KEYS[2], folded)
end
return 1
"""


class RedisSpeakerBook:
    def __init__(self, redis: Redis, prefix: str, link: Link) -> None:
        self._redis = redis
        self._prefix = prefix
        self._link = link
        self._add = redis.register_script(LUA_ADD)
        self._delete = redis.register_script(LUA_DELETE)

    def _keys(self, tenant: str | None) -> list[str]:
        book = f"{self._prefix}speakers:{book_of(tenant)}"
        return [book, book + ":names"]

    async def add(self, tenant: str | None, speaker: EnrolledSpeaker, limit: int) -> None:
        folded = speaker.name.casefold()
        record = orjson.dumps({**speaker.stored(), "folded": folded})
        try:
            added: Any = await self._add(
                keys=self._keys(tenant), args=[speaker.speaker_id, folded, record, limit]
            )
        except UNREACHABLE as exc:
            raise self._link.unavailable(exc, "enrol a speaker") from exc
        self._link.note_success()
        if int(added) == -1:
            raise SpeakerNameTaken(speaker.name)
        if int(added) == 0:
            raise SpeakerBookFull(f"{limit} speakers enrolled already")

    async def list(self, tenant: str | None) -> list[EnrolledSpeaker]:
        try:
            raw: Any = await self._redis.hvals(self._keys(tenant)[0])
        except UNREACHABLE as exc:
            raise self._link.unavailable(exc, "read enrolled speakers") from exc
        self._link.note_success()
        speakers = [EnrolledSpeaker.from_stored(orjson.loads(r)) for r in raw]
        return sorted(speakers, key=lambda s: (s.created_at, s.speaker_id))

    async def get(self, tenant: str | None, speaker_id: str) -> EnrolledSpeaker | None:
        try:
            raw: Any = await self._redis.hget(self._keys(tenant)[0], speaker_id)
        except UNREACHABLE as exc:
            raise self._link.unavailable(exc, "read an enrolled speaker") from exc
        self._link.note_success()
        return None if raw is None else EnrolledSpeaker.from_stored(orjson.loads(raw))

    async def delete(self, tenant: str | None, speaker_id: str) -> bool:
        try:
            deleted: Any = await self._delete(keys=self._keys(tenant), args=[speaker_id])
        except UNREACHABLE as exc:
            raise self._link.unavailable(exc, "delete an enrolled speaker") from exc
        self._link.note_success()
        return int(deleted) == 1
