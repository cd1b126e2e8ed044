"""`DelegationState` in the session Redis: `<prefix>delegation:provisioned` (hash user ->
digest of the profile last given to Synapse) and `<prefix>delegation:resync` (hash user ->
mark, users whose devices Synapse must be told again)."""

from __future__ import annotations

from backends.redis_connect import text
from backends.sessions.delegation import DelegationState
from backends.sessions.redis.part import RedisPart

# KEYS: the resync hash. ARGV: user, mark. Forget the user only if not marked again since.
CLEAR_RESYNC = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
"""


class RedisDelegationState(RedisPart, DelegationState):
    """What Synapse was told, shared by every server on the Redis; part of RedisSessionStore."""

    async def provisioned(self, user: str) -> str | None:
        with self.connection.errors():
            value = await self.connection.connect().hget(f"{self.prefix}delegation:provisioned", user)
        return text(value) if value is not None else None

    async def set_provisioned(self, user: str, digest: str) -> None:
        with self.connection.errors():
            await self.connection.connect().hset(f"{self.prefix}delegation:provisioned", user, digest)

    async def mark_resync(self, user: str, mark: int) -> None:
        with self.connection.errors():
            await self.connection.connect().hset(f"{self.prefix}delegation:resync", user, str(mark))

    async def resyncs(self) -> dict[str, int]:
        with self.connection.errors():
            found = await self.connection.connect().hgetall(f"{self.prefix}delegation:resync")
        return {text(user): int(mark) for user, mark in found.items()}

    async def clear_resync(self, user: str, mark: int) -> bool:
        return bool(await self.script(CLEAR_RESYNC, [f"{self.prefix}delegation:resync"], [user, str(mark)]))
