"""The Redis session store's plumbing, shared by every interface implemented on it."""

from __future__ import annotations

from typing import Any

from backends.redis_connect import RedisConnection


class RedisPart:
    """What every part of the Redis session store reaches: the connection (Sentinel and
    Cluster included), the key prefix every key starts with, and `script`: one Lua script
    (redis_scripts), atomic, on keys that share one Cluster hash tag."""

    connection: RedisConnection
    prefix: str

    async def script(self, script: str, keys: list[str], args: list[Any]) -> Any:
        with self.connection.errors():
            return await self.connection.connect().eval(script, len(keys), *keys, *args)
