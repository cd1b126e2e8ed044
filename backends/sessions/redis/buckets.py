"""`RateBuckets` in the session Redis: `<prefix>rl:<bucket>`, one GCRA bucket each, on Redis `TIME`."""

from __future__ import annotations

from backends.sessions.buckets import RateBuckets
from backends.sessions.redis.part import RedisPart
from backends.sessions.redis.scripts import RATE_LIMIT


class RedisRateBuckets(RedisPart, RateBuckets):
    """Buckets shared by every server on the Redis, each step one script; part of RedisSessionStore."""

    async def rate_limit(self, key: str, interval: float, capacity: float, *, take: bool = True) -> float:
        wait = await self.script(RATE_LIMIT, [f"{self.prefix}rl:{key}"], [repr(interval), repr(capacity), int(take)])
        return float(wait)
