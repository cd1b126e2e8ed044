"""The device authorizations of the OAuth store (RFC 8628) in Redis: a mixin of RedisOAuthStore
(backends.sessions.redis.oauth), under its key prefix.

- `<prefix>oauth:device_code:<digest of the device code>`: hash {record, state, decision,
  last_poll}, expiring with the authorization;
- `<prefix>oauth:user_code:<digest of the user code>`: the device code's digest (SET NX,
  so a live user code is never given twice).

Each change is one script on one key, so it works alike on a Cluster.
"""

from __future__ import annotations

import json
from typing import Any

from backends.redis_connect import text
from backends.sessions.oauth import APPROVED, PENDING, USED, DeviceAuthorization
from backends.sessions.redis.part import RedisPart

ADD = """
redis.call('HSET', KEYS[1], 'record', ARGV[1], 'state', ARGV[2], 'decision', '{}', 'last_poll', 0)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
"""
# ARGV: the new state, the decision (JSON), the state it must be in.
DECIDE = """
if redis.call('HGET', KEYS[1], 'state') ~= ARGV[3] then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'decision', ARGV[2])
return 1
"""
# ARGV: now (ms), interval (ms), APPROVED, USED. Answers record, state, decision, too soon (0/1).
POLL = """
local found = redis.call('HMGET', KEYS[1], 'record', 'state', 'decision', 'last_poll')
if not found[1] then return false end
local last = tonumber(found[4]) or 0
local too_soon = 0
if last > 0 and tonumber(ARGV[1]) - last < tonumber(ARGV[2]) then too_soon = 1 end
local state = found[2]
if state == ARGV[3] and too_soon == 0 then state = ARGV[4] end
redis.call('HSET', KEYS[1], 'last_poll', ARGV[1], 'state', state)
return {found[1], found[2], found[3], too_soon}
"""


class RedisDeviceCodes(RedisPart):
    """The device-code methods of the OAuth store, on the store's connection and prefix (the
    OAuth store's, ending in "oauth:")."""

    def _code_key(self, device_hash: str) -> str:
        return f"{self.prefix}device_code:{device_hash}"

    async def add_device_code(self, device_hash: str, user_code_hash: str, record: dict[str, Any], ttl: float) -> bool:
        px = max(1, int(ttl * 1000))
        with self.connection.errors():
            taken = await self.connection.connect().set(
                f"{self.prefix}user_code:{user_code_hash}", device_hash, px=px, nx=True
            )
        if not taken:
            return False
        await self.script(ADD, [self._code_key(device_hash)], [json.dumps(record), PENDING, px])
        return True

    async def device_code_by_user_code(self, user_code_hash: str) -> DeviceAuthorization | None:
        with self.connection.errors():
            device_hash = await self.connection.connect().get(f"{self.prefix}user_code:{user_code_hash}")
        if device_hash is None:
            return None
        digest = text(device_hash)
        with self.connection.errors():
            found = await self.connection.connect().hmget(self._code_key(digest), ["record", "state", "decision"])
        if found[0] is None:
            return None
        return DeviceAuthorization(digest, json.loads(found[0]), text(found[1] or ""), json.loads(found[2] or "{}"))

    async def decide_device_code(
        self, device_hash: str, state: str, decision: dict[str, Any], expected: str = PENDING
    ) -> bool:
        done = await self.script(DECIDE, [self._code_key(device_hash)], [state, json.dumps(decision), expected])
        return bool(done)

    async def poll_device_code(self, device_hash: str, now_ms: int, interval_ms: int) -> DeviceAuthorization | None:
        found = await self.script(POLL, [self._code_key(device_hash)], [now_ms, interval_ms, APPROVED, USED])
        if not found:
            return None
        return DeviceAuthorization(
            device_hash, json.loads(found[0]), text(found[1]), json.loads(found[2] or "{}"), bool(int(found[3]))
        )
