"""The OAuth store (backends.sessions.oauth) in the Redis session store's Redis, under its key prefix.

Keys (each expires on its own, so nothing needs a sweep):

- `<prefix>oauth:client:<client id>`: the registered metadata, JSON; kept `idle` seconds from
  its last use (each refresh of a grant of it uses it);
- `<prefix>oauth:code:<digest>`: hash {record, uses} of an authorization code;
- `<prefix>oauth:grant:<grant id>`: the Grant, JSON;
- `<prefix>oauth:refresh:<digest>`: the grant id a refresh token belongs to;
- `<prefix>oauth:device:<digest of user and device>`: the grant id of a device.

Each change touches one key atomically (a compare-and-set script where it matters), so it
works alike on a Cluster; an index key left behind by a crash points at a grant that says
otherwise, and is read as such.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from backends.redis_connect import RedisConnection, text
from backends.sessions.base import SessionStore
from backends.sessions.oauth import ENDED, RACED, REFRESHED, RETIRED_REFRESH_TTL, CodeRecord, Grant, OAuthStore
from backends.sessions.records import Session
from backends.sessions.redis.oauth_device import RedisDeviceCodes

ADD_CODE = """
redis.call('HSET', KEYS[1], 'record', ARGV[1], 'uses', 0)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
"""
TAKE_CODE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local uses = redis.call('HINCRBY', KEYS[1], 'uses', 1)
return {redis.call('HGET', KEYS[1], 'record'), uses}
"""
GIVE_BACK_CODE = """
if redis.call('HGET', KEYS[1], 'uses') == ARGV[1] then redis.call('HINCRBY', KEYS[1], 'uses', -1) end
"""
# Compare and set: ARGV[1] the expected current refresh digest, ARGV[2] the new grant, ARGV[3] ms.
ROTATE = """
local value = redis.call('GET', KEYS[1])
if not value then return false end
local grant = cjson.decode(value)
if grant['refresh_hash'] ~= ARGV[1] then return false end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return value
"""

# The first use of the newest access token (ARGV[1], its digest), kept on the grant: 1 when marked.
MARK_USED = """
local value = redis.call('GET', KEYS[1])
if not value then return 0 end
local grant = cjson.decode(value)
if grant['access_hash'] ~= ARGV[1] or grant['access_used'] == true then return 0 end
grant['access_used'] = true
redis.call('SET', KEYS[1], cjson.encode(grant), 'KEEPTTL')
return 1
"""


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


class RedisOAuthStore(RedisDeviceCodes, OAuthStore):
    """On the session store's connection, under its key prefix + "oauth:". A refresh opens and
    ends sessions through the session store (`sessions`); `session_key(user, token digest)`
    names a session's hash, for `access_used`."""

    def __init__(
        self, connection: RedisConnection, prefix: str, *,
        sessions: SessionStore, session_key: Callable[[str, str], str],
    ) -> None:
        super().__init__(connection, prefix)
        self.sessions = sessions
        self.session_key = session_key

    def _device_key(self, user: str, device_id: str) -> str:
        digest = hashlib.sha256(json.dumps([user, device_id]).encode("utf-8", "surrogatepass")).hexdigest()
        return f"{self.prefix}device:{digest}"

    # -- clients --------------------------------------------------------------------

    async def add_client(self, client_id: str, metadata: dict[str, Any], idle: float) -> None:
        with self.connection.errors():
            await self.connection.connect().set(f"{self.prefix}client:{client_id}", json.dumps(metadata), px=_ms(idle))

    async def client(self, client_id: str) -> dict[str, Any] | None:
        with self.connection.errors():
            value = await self.connection.connect().get(f"{self.prefix}client:{client_id}")
        return json.loads(value) if value is not None else None

    async def touch_client(self, client_id: str, idle: float) -> None:
        with self.connection.errors():
            await self.connection.connect().pexpire(f"{self.prefix}client:{client_id}", _ms(idle), gt=True)

    # -- codes ----------------------------------------------------------------------

    async def add_code(self, code_hash: str, record: CodeRecord, ttl: float) -> None:
        await self.script(ADD_CODE, [f"{self.prefix}code:{code_hash}"], [record.encode(), _ms(ttl)])

    async def take_code(self, code_hash: str) -> tuple[CodeRecord, int] | None:
        found = await self.script(TAKE_CODE, [f"{self.prefix}code:{code_hash}"], [])
        if not found:
            return None
        return CodeRecord.decode(found[0]), int(found[1])

    async def give_back_code(self, code_hash: str, uses: int) -> None:
        await self.script(GIVE_BACK_CODE, [f"{self.prefix}code:{code_hash}"], [str(uses)])

    # -- grants ---------------------------------------------------------------------

    async def _get(self, grant_id: str) -> Grant | None:
        with self.connection.errors():
            value = await self.connection.connect().get(f"{self.prefix}grant:{grant_id}")
        return Grant.decode(value) if value is not None else None

    def grant_keys(self, grant: Grant) -> list[tuple[str, str]]:
        """The keys a grant is kept under and their values: itself, its current and previous
        refresh tokens, its device (for a move's batch: no grant of the device yet)."""
        keys = [(f"{self.prefix}grant:{grant.grant_id}", grant.encode())]
        keys += [(f"{self.prefix}refresh:{digest}", grant.grant_id)
                 for digest in (grant.refresh_hash, grant.previous_hash) if digest]
        return [*keys, (self._device_key(grant.user, grant.device_id), grant.grant_id)]

    async def add_grant(self, grant: Grant, idle: float) -> None:
        old = await self.device_grant(grant.user, grant.device_id)
        if old is not None:
            await self.delete_grant(old)
        px = _ms(idle)
        client = self.connection.connect()
        with self.connection.errors():
            await client.set(f"{self.prefix}grant:{grant.grant_id}", grant.encode(), px=px)
            await client.set(f"{self.prefix}refresh:{grant.refresh_hash}", grant.grant_id, px=px)
            await client.set(self._device_key(grant.user, grant.device_id), grant.grant_id, px=px)

    async def grant_by_refresh(self, refresh_hash: str) -> Grant | None:
        with self.connection.errors():
            grant_id = await self.connection.connect().get(f"{self.prefix}refresh:{refresh_hash}")
        return await self._get(text(grant_id)) if grant_id is not None else None

    async def rotate_grant(self, expected_refresh_hash: str, grant: Grant, idle: float) -> bool:
        px = _ms(idle)
        before = await self.script(
            ROTATE, [f"{self.prefix}grant:{grant.grant_id}"], [expected_refresh_hash, grant.encode(), px]
        )
        if not before:
            return False
        old = Grant.decode(before)
        client = self.connection.connect()
        with self.connection.errors():
            await client.set(f"{self.prefix}refresh:{grant.refresh_hash}", grant.grant_id, px=px)
            if grant.previous_hash:
                await client.pexpire(f"{self.prefix}refresh:{grant.previous_hash}", px)
            for retired in {old.previous_hash, old.refresh_hash} - {grant.previous_hash, grant.refresh_hash, ""}:
                await client.pexpire(f"{self.prefix}refresh:{retired}", _ms(RETIRED_REFRESH_TTL))
            await client.pexpire(self._device_key(grant.user, grant.device_id), px)
        return True

    async def refresh_grant(
        self, expected_refresh_hash: str, grant: Grant, idle: float, access: Session, *,
        grant_session: str, end_access: str = "", client_idle: float | None = None,
    ) -> str:
        # Several steps here (the grant's keys carry no user hash tag, so no one script on a
        # Cluster): the grant's session is read again once the new access session exists.
        sessions = self.sessions
        if not await self.rotate_grant(expected_refresh_hash, grant, idle):
            return RACED
        await sessions.open(access, None)
        if end_access:
            await sessions.end(grant.user, end_access)
        still = await sessions.get(grant.user, grant_session)
        if still is None or still.ended_ts is not None:
            await sessions.end(grant.user, access.token_hash)
            await self.delete_grant(grant)
            return ENDED
        if client_idle is not None:
            await self.touch_client(grant.client_id, client_idle)
        return REFRESHED

    async def device_grant(self, user: str, device_id: str) -> Grant | None:
        with self.connection.errors():
            grant_id = await self.connection.connect().get(self._device_key(user, device_id))
        if grant_id is None:
            return None
        grant = await self._get(text(grant_id))
        return grant if grant is not None and (grant.user, grant.device_id) == (user, device_id) else None

    async def delete_grant(self, grant: Grant) -> None:
        client = self.connection.connect()
        with self.connection.errors():
            current = await self.device_grant(grant.user, grant.device_id)
            if current is not None and current.grant_id == grant.grant_id:
                await client.delete(self._device_key(grant.user, grant.device_id))
            await client.delete(f"{self.prefix}grant:{grant.grant_id}")
            for digest in (grant.refresh_hash, grant.previous_hash):
                if digest:
                    await client.delete(f"{self.prefix}refresh:{digest}")

    async def mark_access_used(self, user: str, device_id: str, access_hash: str) -> bool:
        with self.connection.errors():
            grant_id = await self.connection.connect().get(self._device_key(user, device_id))
        if grant_id is None:
            return False
        return bool(await self.script(MARK_USED, [f"{self.prefix}grant:{text(grant_id)}"], [access_hash]))

    async def access_used(self, user: str, token_hash: str) -> bool | None:
        with self.connection.errors():
            found = await self.connection.connect().hmget(
                self.session_key(user, token_hash), ["user", "created_ts", "last_seen_ts", "ended_ts"]
            )
        owner, created, seen, ended = (text(v) if v is not None else None for v in found)
        if owner != user or created is None or seen is None:
            return None
        return bool(ended) or int(seen) > int(created)
