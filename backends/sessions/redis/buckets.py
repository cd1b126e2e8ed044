"""`RateBuckets` in the session Redis: `<prefix>rl:<bucket>`, one GCRA bucket each, on Redis `TIME`."""

from __future__ import annotations

from backends.sessions.buckets import RateBuckets
from backends.sessions.redis.part import RedisPart

# GCRA, as homeserver.ratelimit.TokenBuckets, on Redis' clock. KEYS: the bucket.
# ARGV: interval, capacity, "1" to take. Returns the wait in seconds as text ("0": allowed).
RATE_LIMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local interval, capacity = tonumber(ARGV[1]), tonumber(ARGV[2])
local full_at = tonumber(redis.call('GET', KEYS[1]) or now)
local new_full_at = math.max(full_at, now) + interval
local excess = new_full_at - now - capacity
if excess > 1e-9 then return tostring(excess) end
if ARGV[3] == '1' then
  -- The bucket is forgotten once it is full again.
  redis.call('SET', KEYS[1], string.format('%.6f', new_full_at), 'PXAT', math.ceil(new_full_at * 1000))
end
return '0'
"""


class RedisRateBuckets(RedisPart, RateBuckets):
    """Buckets shared by every server on the Redis, each step one script; part of RedisSessionStore."""

    async def rate_limit(self, key: str, interval: float, capacity: float, *, take: bool = True) -> float:
        wait = await self.script(RATE_LIMIT, [f"{self.prefix}rl:{key}"], [repr(interval), repr(capacity), int(take)])
        return float(wait)
