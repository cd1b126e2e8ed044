"""The Redis session store's plumbing, shared by every part of it."""

from __future__ import annotations

import hashlib
from typing import Any

from backends.redis_connect import RedisConnection


def user_base(prefix: str, user: str) -> str:
    """The part every key of `user` starts with under `prefix`, hash tag included: every key of
    one user sits in one Cluster slot, so a change to them is one script. The tag is a digest
    of the name, so no name can break out of it."""
    tag = hashlib.sha256(user.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{prefix}{{{tag}}}:"


class RedisPart:
    """What every part of the Redis session store stands on: the connection (Sentinel and
    Cluster included), the key prefix every key of the part starts with, and `script`: one
    Lua script, atomic, on keys that share one Cluster hash tag. A part is built with the
    store, before start."""

    def __init__(self, connection: RedisConnection, prefix: str) -> None:
        self.connection = connection
        self.prefix = prefix

    async def script(self, script: str, keys: list[str], args: list[Any]) -> Any:
        with self.connection.errors():
            return await self.connection.connect().eval(script, len(keys), *keys, *args)
