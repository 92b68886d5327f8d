"""Upload job records on Redis, so any node answers for any job.

{prefix}job:{id}   hash: b (the record, as the running node wrote it), n (that node's
                   id), f ("1" once finished), c ("1" once a cancel was requested);
                   TTL: the record's, renewed by every write

The node running a job writes its record as it changes (`put`), and learns in the same
round trip whether another node asked to cancel it. A reader that finds an unfinished
job whose node's lease (store/redis/leases.py) expired knows that node died.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from store.api import JobEntry
from store.redis.leases import RedisLeases
from store.redis.link import UNREACHABLE, Link
from wire.query import validate_id

# KEYS[1] the job. ARGV[1] record, [2] node id, [3] finished "1"/"0", [4] TTL ms.
LUA_PUT = """
if redis.call('HGET', KEYS[1], 'c') == '1' then return 0 end
redis.call('HSET', KEYS[1], 'b', ARGV[1], 'n', ARGV[2], 'f', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
"""

# KEYS[1] the job. Returns 1 if the job was there and not yet cancelled.
LUA_CANCEL = """
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('HGET', KEYS[1], 'c') == '1' then
  return 0
end
redis.call('HSET', KEYS[1], 'c', '1')
return 1
"""


class RedisJobs:
    """The store's `jobs` on Redis."""

    def __init__(self, redis: Redis, prefix: str, leases: RedisLeases, link: Link) -> None:
        self._redis = redis
        self._prefix = prefix
        self._leases = leases
        self._link = link
        self.node_id = leases.node_id
        self._put = redis.register_script(LUA_PUT)
        self._cancel = redis.register_script(LUA_CANCEL)

    def _key(self, job_id: str) -> str:
        return f"{self._prefix}job:{validate_id('job_id', job_id)}"

    async def put(self, job_id: str, body: bytes, *, finished: bool, ttl_s: float) -> bool:
        await self._leases.start()  # readers must find this node alive while it works
        try:
            written = await self._put(
                keys=[self._key(job_id)],
                args=[body, self.node_id, "1" if finished else "0", max(1, int(ttl_s * 1000))],
            )
        except UNREACHABLE as exc:
            raise self._link.unavailable(exc, "write an upload job") from exc
        self._link.note_success()
        return bool(written)

    async def get(self, job_id: str) -> JobEntry | None:
        try:
            fields: Any = await self._redis.hmget(self._key(job_id), ["b", "n", "f", "c"])
        except UNREACHABLE as exc:
            raise self._link.unavailable(exc, "read an upload job") from exc
        self._link.note_success()
        body, node, finished, cancel = fields
        if body is None or cancel == b"1":
            return None
        done = finished == b"1"
        node_id = node.decode()
        alive = done or node_id == self.node_id or await self._leases.alive(node_id)
        return JobEntry(body, node_id, done, node_alive=alive)

    async def request_cancel(self, job_id: str) -> bool:
        try:
            found = await self._cancel(keys=[self._key(job_id)])
        except UNREACHABLE as exc:
            raise self._link.unavailable(exc, "cancel an upload job") from exc
        self._link.note_success()
        return bool(found)

    async def delete(self, job_id: str) -> None:
        try:
            await self._redis.delete(self._key(job_id))
        except UNREACHABLE as exc:
            raise self._link.unavailable(exc, "delete an upload job") from exc
