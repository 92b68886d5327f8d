"""Every Redis key and channel of a meeting, and the Lua scripts that write them: each
write is one script (one round trip), so the final, its `seq`, the source's state and the
TTL refresh of all the meeting's keys land together or not at all."""

from __future__ import annotations

from wire.query import validate_id

MAX_PREFIX = 64


class Keys:
    """Every key and channel name, built from validated ids only.

    {prefix}meeting:{id}:meta    hash: cfg (JSON), act (last write, epoch s), acc (accesses)
    {prefix}meeting:{id}:log     stream of finals, entry id "{seq}-0", field f = JSON
    {prefix}meeting:{id}:src     hash: s:{sid} state JSON, g:{sid} generation,
                                 u:{utterance id} → its seq (idempotent appends),
                                 sp:{utterance id} → its speaker after a relabel,
                                 t:{sha256(token)} → sid
    {prefix}meeting:{id}:events  pub/sub channel (not a key)
    {prefix}token:{sha256}       meeting id of a token: a hint to tell "another meeting"
                                 from "unknown"
    """

    def __init__(self, prefix: str) -> None:
        if not prefix or len(prefix) > MAX_PREFIX or any(c.isspace() for c in prefix):
            raise ValueError(f"key prefix must be 1-{MAX_PREFIX} characters without spaces")
        self.prefix = prefix

    def meeting(self, meeting_id: str) -> list[str]:
        """[meta, log, src]: the keys every meeting script takes as KEYS[1..3]."""
        base = f"{self.prefix}meeting:{validate_id('meeting_id', meeting_id)}:"
        return [base + "meta", base + "log", base + "src"]

    def events(self, meeting_id: str) -> bytes:
        return f"{self.prefix}meeting:{validate_id('meeting_id', meeting_id)}:events".encode()

    def token(self, digest: str) -> str:
        return f"{self.prefix}token:{digest}"


# ---------------------------------------------------------------- Lua

# ARGV[1] now (epoch s, from the injected clock), ARGV[2] jitter u in [-1, 1],
# ARGV[3..8] TTLSettings.lua_args(); KEYS[1..3] meta, log, src. The TTL arithmetic is
# store.ttl.ttl_ms, in the same order.
LUA_COMMON = """
local now = tonumber(ARGV[1])
local u = tonumber(ARGV[2])
local function ttl_for(idle)
  local acc = redis.call('HINCRBY', KEYS[1], 'acc', 1)
  local t = math.floor(tonumber(ARGV[3]) * math.max(tonumber(ARGV[4]), 1 - idle / tonumber(ARGV[5]))
    * math.min(tonumber(ARGV[7]), 1 + tonumber(ARGV[6]) * acc) * (1 + tonumber(ARGV[8]) * u))
  if t < 1000 then t = 1000 end
  return t
end
local function set_ttl(t)
  for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], t) end
end
local function extend_ttl(t)
  for i = 1, 3 do
    local cur = redis.call('PTTL', KEYS[i])
    if cur >= 0 and cur < t then redis.call('PEXPIRE', KEYS[i], t) end
  end
end
local function last_seq()
  local top = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
  if top[1] then return tonumber(string.match(top[1][1], '^(%d+)')) end
  return 0
end
"""

# KEYS[4] token hint. ARGV[9] sid, [10] token hash, [11] state JSON, [12] config JSON or '',
# [13] meeting id, [14] hint TTL ms. Returns the meeting's last seq.
LUA_CREATE = (
    LUA_COMMON
    + """
if ARGV[12] ~= '' then redis.call('HSETNX', KEYS[1], 'cfg', ARGV[12]) end
redis.call('HSET', KEYS[1], 'act', ARGV[1])
redis.call('HSET', KEYS[3], 's:' .. ARGV[9], ARGV[11], 't:' .. ARGV[10], ARGV[9])
redis.call('HSETNX', KEYS[3], 'g:' .. ARGV[9], 1)
set_ttl(ttl_for(0))
redis.call('SET', KEYS[4], ARGV[13], 'PX', ARGV[14])
return last_seq()
"""
)

# ARGV[9] sid, [10] utterance id, [11] final JSON, [12] state JSON, [13] generation,
# [14] lowest acceptable seq (the provisional one on replay; 0 for none), [15] '1' on replay.
# Returns {1, seq} appended, {2, seq} already logged (same utterance id), {3, generation}
# superseded. A replayed final is logged even if its source was resumed meanwhile (finals
# are never dropped), but then it does not overwrite the newer session's source state.
LUA_APPEND = (
    LUA_COMMON
    + """
local sid = ARGV[9]
local logged = redis.call('HGET', KEYS[3], 'u:' .. ARGV[10])
if logged then return {2, tonumber(logged)} end
local gen = tonumber(ARGV[13])
local stored = tonumber(redis.call('HGET', KEYS[3], 'g:' .. sid) or '0')
if stored > gen and ARGV[15] ~= '1' then return {3, stored} end
local seq = last_seq() + 1
local lowest = tonumber(ARGV[14])
if lowest > seq then seq = lowest end
redis.call('XADD', KEYS[2], seq .. '-0', 'f', ARGV[11])
redis.call('HSET', KEYS[3], 'u:' .. ARGV[10], seq)
if stored <= gen then redis.call('HSET', KEYS[3], 's:' .. sid, ARGV[12], 'g:' .. sid, gen) end
redis.call('HSET', KEYS[1], 'act', ARGV[1])
set_ttl(ttl_for(0))
return {1, seq}
"""
)

# A read (finals): counts as an access and may only extend the TTL. Returns 0 if the
# meeting does not exist. The log itself is read with plain XRANGE pages: returning it
# from Lua costs Redis 8-15x more time (25 ms for 2000 finals, blocking every room).
LUA_TOUCH = (
    LUA_COMMON
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local act = tonumber(redis.call('HGET', KEYS[1], 'act') or ARGV[1])
extend_ttl(ttl_for(math.max(0, now - act)))
return 1
"""
)

# KEYS[4] token hint. ARGV[9] token hash, [10] participant or '', [11] hint TTL ms.
# Returns {0, hint meeting or nil} unknown here, {2, participant} wrong participant,
# {1, sid, state JSON, generation, last seq} resumed.
LUA_RESUME = (
    LUA_COMMON
    + """
local sid = redis.call('HGET', KEYS[3], 't:' .. ARGV[9])
local state = sid and redis.call('HGET', KEYS[3], 's:' .. sid)
if not state then return {0, redis.call('GET', KEYS[4])} end
if ARGV[10] ~= '' then
  local who = cjson.decode(state)['participant']
  if who ~= ARGV[10] then return {2, who} end
end
local gen = redis.call('HINCRBY', KEYS[3], 'g:' .. sid, 1)
redis.call('HSET', KEYS[1], 'act', ARGV[1])
set_ttl(ttl_for(0))
redis.call('PEXPIRE', KEYS[4], ARGV[11])
return {1, sid, state, gen, last_seq()}
"""
)

APPENDED, DUPLICATE, SUPERSEDED = 1, 2, 3  # what LUA_APPEND returns first
