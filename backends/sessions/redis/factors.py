"""The second factors (backends.sessions.factors) in the session Redis, on its connection.

Keys:

- `<prefix>{<tag>}:mfa`: hash of one person's factors (the tag is the user's, as their
  sessions'): `f:<factor id>` -> the Factor as JSON (secrets sealed, recovery codes as
  digests), `o:<factor id>` -> its place in the order they were added, `#seq` -> the last
  place given. No expiry: factors stay until removed.
- `<prefix>mfa:challenge:<digest>`: a WebAuthn challenge (JSON), expiring with it; taken by
  GETDEL, so of two takes one gets it.

Every compare-and-set (a TOTP step, a passkey's counter, a recovery code taken out) is one
Lua script on the person's hash: atomic on every process and on a Cluster.
"""

from __future__ import annotations

import time
from base64 import b64encode
from typing import Any

from backends.redis_connect import text
from backends.sessions.factors import WEBAUTHN, Challenge, Factor, FactorStore
from backends.sessions.redis.part import RedisPart, user_base

# KEYS: the person's hash. ARGV: factor id, the Factor's JSON, kind, credential id (base64;
# "" unless a passkey). 0 when the id is taken, or the person has that passkey already.
ADD = """
if redis.call('HEXISTS', KEYS[1], 'f:' .. ARGV[1]) == 1 then return 0 end
if ARGV[3] == 'webauthn' then
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 2) == 'f:' then
      local other = cjson.decode(all[i + 1])
      if other['kind'] == 'webauthn' and other['credential_id'] == ARGV[4] then return 0 end
    end
  end
end
local seq = redis.call('HINCRBY', KEYS[1], '#seq', 1)
redis.call('HSET', KEYS[1], 'f:' .. ARGV[1], ARGV[2], 'o:' .. ARGV[1], seq)
return 1
"""

# KEYS: the person's hash. ARGV: factor id, "1" to keep one (refused, 0, when the person has
# no app or passkey but this one). 1 when it was there and is removed; with the person's last
# app or passkey, their recovery codes (the whole hash) go too.
REMOVE = """
if redis.call('HEXISTS', KEYS[1], 'f:' .. ARGV[1]) == 0 then return 0 end
local other = false
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if string.sub(all[i], 1, 2) == 'f:' and string.sub(all[i], 3) ~= ARGV[1]
      and cjson.decode(all[i + 1])['kind'] ~= 'recovery' then
    other = true
    break
  end
end
if not other then
  if ARGV[2] == '1' then return 0 end
  redis.call('DEL', KEYS[1])
  return 1
end
redis.call('HDEL', KEYS[1], 'f:' .. ARGV[1], 'o:' .. ARGV[1])
return 1
"""

# KEYS: the person's hash. How many factors there were.
REMOVE_ALL = """
local count = 0
for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(field, 1, 2) == 'f:' then count = count + 1 end
end
redis.call('DEL', KEYS[1])
return count
"""

# KEYS: the person's hash. ARGV: the new set's factor id and JSON. The old set goes.
SET_RECOVERY = """
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if string.sub(all[i], 1, 2) == 'f:' and cjson.decode(all[i + 1])['kind'] == 'recovery' then
    local id = string.sub(all[i], 3)
    redis.call('HDEL', KEYS[1], 'f:' .. id, 'o:' .. id)
  end
end
local seq = redis.call('HINCRBY', KEYS[1], '#seq', 1)
redis.call('HSET', KEYS[1], 'f:' .. ARGV[1], ARGV[2], 'o:' .. ARGV[1], seq)
"""

# KEYS: the person's hash. ARGV: the set's factor id and JSON. 0 when the person has a set,
# or no app nor passkey.
ADD_RECOVERY = """
local all = redis.call('HGETALL', KEYS[1])
local factor = false
for i = 1, #all, 2 do
  if string.sub(all[i], 1, 2) == 'f:' then
    if cjson.decode(all[i + 1])['kind'] == 'recovery' then return 0 end
    factor = true
  end
end
if not factor then return 0 end
local seq = redis.call('HINCRBY', KEYS[1], '#seq', 1)
redis.call('HSET', KEYS[1], 'f:' .. ARGV[1], ARGV[2], 'o:' .. ARGV[1], seq)
return 1
"""

# KEYS: the person's hash. ARGV: factor id, what to change ("step", "count", "secret"), the
# value, now (ms). 1 when changed; 0 when the factor is gone or the value does not move on.
UPDATE = """
local value = redis.call('HGET', KEYS[1], 'f:' .. ARGV[1])
if not value then return 0 end
local f = cjson.decode(value)
if ARGV[2] == 'step' then
  local step = tonumber(ARGV[3])
  if step <= f['last_step'] then return 0 end
  f['last_step'] = step
  f['last_used_ts'] = tonumber(ARGV[4])
elseif ARGV[2] == 'count' then
  local count = tonumber(ARGV[3])
  if not (count > f['sign_count'] or (count == 0 and f['sign_count'] == 0)) then return 0 end
  f['sign_count'] = count
  f['last_used_ts'] = tonumber(ARGV[4])
else
  f['sealed_secret'] = ARGV[3]
end
redis.call('HSET', KEYS[1], 'f:' .. ARGV[1], cjson.encode(f))
return 1
"""

# KEYS: the person's hash. ARGV: the code's digest, now (ms). 1 when it was taken out.
USE_RECOVERY = """
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if string.sub(all[i], 1, 2) == 'f:' then
    local f = cjson.decode(all[i + 1])
    if f['kind'] == 'recovery' then
      local left, found = {}, false
      for _, digest in ipairs(f['code_hashes']) do
        if digest == ARGV[1] and not found then found = true else table.insert(left, digest) end
      end
      if not found then return 0 end
      f['code_hashes'] = left
      f['last_used_ts'] = tonumber(ARGV[2])
      redis.call('HSET', KEYS[1], all[i], cjson.encode(f))
      return 1
    end
  end
end
return 0
"""


class RedisFactorStore(RedisPart, FactorStore):
    """`<prefix>{<tag>}:mfa` per person and `<prefix>mfa:challenge:<digest>` (this module's docstring)."""

    def _key(self, user: str) -> str:
        return f"{user_base(self.prefix, user)}mfa"

    def _challenge_key(self, key: str) -> str:
        return f"{self.prefix}mfa:challenge:{key}"

    async def factors(self, user: str) -> list[Factor]:
        with self.connection.errors():
            fields = await self.connection.connect().hgetall(self._key(user))
        found = {text(k): v for k, v in fields.items()}
        places = {name[2:]: int(value) for name, value in found.items() if name.startswith("o:")}
        factors = [Factor.decode(value) for name, value in found.items() if name.startswith("f:")]
        return sorted((f for f in factors if f.user == user), key=lambda f: places.get(f.factor_id, 0))

    async def factor(self, user: str, factor_id: str) -> Factor | None:
        with self.connection.errors():
            value = await self.connection.connect().hget(self._key(user), f"f:{factor_id}")
        found = Factor.decode(value) if value is not None else None
        return found if found is not None and found.user == user else None

    async def add_factor(self, factor: Factor) -> bool:
        # The credential id as Factor.encode writes it (base64), for the script to compare.
        credential = b64encode(factor.credential_id).decode("ascii") if factor.kind == WEBAUTHN else ""
        args: list[Any] = [factor.factor_id, factor.encode(), factor.kind, credential]
        return bool(await self.script(ADD, [self._key(factor.user)], args))

    async def remove_factor(self, user: str, factor_id: str, *, keep_one: bool = False) -> bool:
        return bool(await self.script(REMOVE, [self._key(user)], [factor_id, "1" if keep_one else "0"]))

    async def remove_all(self, user: str) -> int:
        return int(await self.script(REMOVE_ALL, [self._key(user)], []))

    async def set_recovery_codes(self, factor: Factor) -> None:
        await self.script(SET_RECOVERY, [self._key(factor.user)], [factor.factor_id, factor.encode()])

    async def add_recovery_codes(self, factor: Factor) -> bool:
        return bool(await self.script(ADD_RECOVERY, [self._key(factor.user)], [factor.factor_id, factor.encode()]))

    async def _update(self, user: str, factor_id: str, what: str, value: Any, now_ms: int = 0) -> bool:
        return bool(await self.script(UPDATE, [self._key(user)], [factor_id, what, value, now_ms]))

    async def accept_totp_step(self, user: str, factor_id: str, step: int, now_ms: int) -> bool:
        return await self._update(user, factor_id, "step", step, now_ms)

    async def update_sealed_secret(self, user: str, factor_id: str, sealed_secret: bytes) -> bool:
        return await self._update(user, factor_id, "secret", b64encode(sealed_secret).decode("ascii"))

    async def accept_sign_count(self, user: str, factor_id: str, sign_count: int, now_ms: int) -> bool:
        return await self._update(user, factor_id, "count", sign_count, now_ms)

    async def use_recovery_code(self, user: str, code_hash: str, now_ms: int) -> bool:
        return bool(await self.script(USE_RECOVERY, [self._key(user)], [code_hash, now_ms]))

    async def add_challenge(self, challenge: Challenge) -> None:
        ttl = challenge.expires_ts - int(time.time() * 1000)
        if ttl <= 0:
            return  # expired already: never found
        with self.connection.errors():
            await self.connection.connect().set(self._challenge_key(challenge.key), challenge.encode(), px=ttl)

    async def take_challenge(self, key: str) -> Challenge | None:
        with self.connection.errors():
            value = await self.connection.connect().getdel(self._challenge_key(key))
        if value is None:
            return None
        challenge = Challenge.decode(value)
        return challenge if challenge.expires_ts > time.time() * 1000 else None
