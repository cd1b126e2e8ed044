"""The account page's sign-ins in the Redis session store, on its connection, under the user's hash tag."""

from __future__ import annotations

from backends.redis_connect import text
from backends.sessions.browser import BrowserSession, BrowserSessions
from backends.sessions.redis.part import RedisPart, user_base

# KEYS: the sign-in's hash, the user's set of sign-ins. ARGV: id, user, created, expires (s),
# ip, user agent, second factor. Both keys expire with the sign-in (the set with its longest-lived one).
OPEN = """
redis.call('HSET', KEYS[1], 'user', ARGV[2], 'created', ARGV[3], 'expires', ARGV[4],
           'ip', ARGV[5], 'user_agent', ARGV[6], 'second_factor', ARGV[7])
redis.call('EXPIREAT', KEYS[1], ARGV[4])
redis.call('SADD', KEYS[2], ARGV[1])
if redis.call('EXPIRETIME', KEYS[2]) < tonumber(ARGV[4]) then redis.call('EXPIREAT', KEYS[2], ARGV[4]) end
return 1
"""

# KEYS: the user's set. ARGV: base, user, "1" to end them all. The standing sign-ins as flat
# id, created, expires, ip, user agent, second factor (or, when ending, how many stood); members whose hash
# is gone (expired) or another user's are dropped.
EACH = """
local out, count = {}, 0
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local key = ARGV[1] .. 'p:' .. id
  local fields = redis.call('HMGET', key, 'user', 'created', 'expires', 'ip', 'user_agent', 'second_factor')
  if fields[1] ~= ARGV[2] then
    redis.call('SREM', KEYS[1], id)
  elseif ARGV[3] == '1' then
    redis.call('DEL', key)
    count = count + 1
  else
    table.insert(out, id)
    for i = 2, 5 do table.insert(out, fields[i]) end
    table.insert(out, fields[6] or '')
  end
end
if ARGV[3] == '1' then
  redis.call('DEL', KEYS[1])
  return count
end
return out
"""

# KEYS: the sign-in's hash, the user's set. ARGV: id, user. 1 if it stood.
END = """
if redis.call('HGET', KEYS[1], 'user') ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
return 1
"""


class RedisBrowserSessions(RedisPart, BrowserSessions):
    """`<prefix>{<tag>}:p:<id>`: hash of one sign-in (user, created, expires, ip, user_agent,
    second_factor), expiring with it; `<prefix>{<tag>}:pages`:
    set of the user's sign-in ids (the tag is the user's, as the sessions'). An end deletes
    the hash."""

    def _keys(self, user: str, session_id: str) -> list[str]:
        base = user_base(self.prefix, user)
        return [f"{base}p:{session_id}", f"{base}pages"]

    async def open(self, session: BrowserSession) -> None:
        await self.script(
            OPEN,
            self._keys(session.user, session.id),
            [session.id, session.user, session.created, session.expires, session.ip, session.user_agent,
             session.second_factor],
        )

    async def list_open(self, user: str) -> list[BrowserSession]:
        base = user_base(self.prefix, user)
        flat = [text(item) for item in await self.script(EACH, [f"{base}pages"], [base, user, "0"])]
        found = [
            BrowserSession(flat[i], user, int(flat[i + 1]), int(flat[i + 2]), flat[i + 3], flat[i + 4], flat[i + 5])
            for i in range(0, len(flat), 6)
        ]
        return sorted(found, key=lambda s: (s.created, s.id))

    async def end(self, user: str, session_id: str) -> bool:
        return bool(await self.script(END, self._keys(user, session_id), [session_id, user]))

    async def ended(self, user: str, session_id: str) -> bool:
        with self.connection.errors():
            owner = await self.connection.connect().hget(self._keys(user, session_id)[0], "user")
        return owner is None or text(owner) != user

    async def end_all(self, user: str) -> int:
        base = user_base(self.prefix, user)
        return int(await self.script(EACH, [f"{base}pages"], [base, user, "1"]))
