"""`DelegationState` in the session Redis:

- `<prefix>delegation:provisioned` (hash user -> digest of the profile last given to Synapse);
- `<prefix>delegation:resync` (hash user -> mark, users whose devices Synapse must be told again);
- `<prefix>delegation:missing` (hash user -> ms, users provisioned at Synapse the directory
  sweep found missing from the user store, since when);
- `<prefix>delegation:sweep` (hash: `holder` and `until`, the sweep's lease, on Redis `TIME`;
  `started`, when the last sweep started; `reference`, the users the last sweep the guard let
  through found). One key, so the claim is one script wherever the key's slot is (Cluster).
"""

from __future__ import annotations

from collections.abc import Collection

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

# KEYS: the sweep hash. ARGV: holder, ttl ms, interval ms ('' when a sweep is due whenever the
# lease is free). Take the lease unless another holder's runs or the last sweep is too recent.
CLAIM_SWEEP = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h = redis.call('HMGET', KEYS[1], 'holder', 'until', 'started')
if h[1] and h[1] ~= '' and h[1] ~= ARGV[1] and tonumber(h[2] or '0') > now then
  return 0
end
if ARGV[3] ~= '' and h[3] and tonumber(h[3]) + tonumber(ARGV[3]) > now then
  return 0
end
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'until', string.format('%d', now + tonumber(ARGV[2])),
           'started', string.format('%d', now))
return 1
"""

# KEYS: the sweep hash. ARGV: holder, ttl ms. Renew the lease of a holder that still has it.
RENEW_SWEEP = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h = redis.call('HMGET', KEYS[1], 'holder', 'until')
if h[1] ~= ARGV[1] or tonumber(h[2] or '0') <= now then
  return 0
end
redis.call('HSET', KEYS[1], 'until', string.format('%d', now + tonumber(ARGV[2])))
return 1
"""

# KEYS: the sweep hash. ARGV: holder. Give the lease back if it is the holder's.
RELEASE_SWEEP = """
if redis.call('HGET', KEYS[1], 'holder') == ARGV[1] then
  redis.call('HSET', KEYS[1], 'holder', '', 'until', '0')
end
return 0
"""

# Users written per round trip by the many-user writes.
CHUNK = 1000


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

    # -- the directory sweep ----------------------------------------------------------------

    async def provisioned_all(self) -> dict[str, str]:
        with self.connection.errors():
            found = await self.connection.connect().hgetall(f"{self.prefix}delegation:provisioned")
        return {text(user): text(digest) for user, digest in found.items()}

    async def missing(self) -> dict[str, int]:
        with self.connection.errors():
            found = await self.connection.connect().hgetall(f"{self.prefix}delegation:missing")
        return {text(user): int(since) for user, since in found.items()}

    async def set_missing(self, since: dict[str, int]) -> None:
        items = list(since.items())
        key = f"{self.prefix}delegation:missing"
        with self.connection.errors():
            for start in range(0, len(items), CHUNK):
                pipe = self.connection.connect().pipeline(transaction=False)
                for user, ms in items[start:start + CHUNK]:
                    pipe.hsetnx(key, user, str(ms))
                await pipe.execute()

    async def clear_missing(self, users: Collection[str]) -> None:
        names = list(users)
        with self.connection.errors():
            for start in range(0, len(names), CHUNK):
                await self.connection.connect().hdel(f"{self.prefix}delegation:missing", *names[start:start + CHUNK])

    async def claim_sweep(self, holder: str, ttl_ms: int, interval_ms: int | None) -> bool:
        interval = "" if interval_ms is None else str(interval_ms)
        return bool(await self.script(CLAIM_SWEEP, [f"{self.prefix}delegation:sweep"], [holder, str(ttl_ms), interval]))

    async def renew_sweep(self, holder: str, ttl_ms: int) -> bool:
        return bool(await self.script(RENEW_SWEEP, [f"{self.prefix}delegation:sweep"], [holder, str(ttl_ms)]))

    async def release_sweep(self, holder: str) -> None:
        await self.script(RELEASE_SWEEP, [f"{self.prefix}delegation:sweep"], [holder])

    async def sweep_reference(self) -> int | None:
        with self.connection.errors():
            value = await self.connection.connect().hget(f"{self.prefix}delegation:sweep", "reference")
        return int(value) if value is not None else None

    async def set_sweep_reference(self, count: int) -> None:
        with self.connection.errors():
            await self.connection.connect().hset(f"{self.prefix}delegation:sweep", "reference", str(count))
