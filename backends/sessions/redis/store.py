"""Redis session store: sessions shared by every server on one Redis (standalone, Sentinel, Cluster)."""

from __future__ import annotations

import logging
from typing import Any

from backends.base import ConfigError
from backends.redis_connect import RedisConnection, text
from backends.sessions.base import SessionStore
from backends.sessions.records import Device, Session
from backends.sessions.redis.browser import RedisBrowserSessions
from backends.sessions.redis.buckets import RedisRateBuckets
from backends.sessions.redis.delegation import RedisDelegationState
from backends.sessions.redis.factors import RedisFactorStore
from backends.sessions.redis.imported import RedisImportedState
from backends.sessions.redis.login_tokens import RedisLoginTokens
from backends.sessions.redis.oauth import RedisOAuthStore
from backends.sessions.redis.part import RedisPart, user_base
from backends.sessions.redis.scripts import (
    DEVICES,
    END,
    END_DEVICES,
    END_STALE,
    OPEN,
    REFINGERPRINT,
    RENAME,
    TOUCH,
    fingerprint_rule_args,
)

logger = logging.getLogger(__name__)

STORE = "session store"


class RedisSessionStore(RedisPart, SessionStore):
    """Sessions and devices in Redis; its other parts (OAuth, the page sign-ins, rate buckets,
    delegation state) there too, one object each on the same connection (part.RedisPart),
    behind one door each (`oauth()`, ...). Every key of one user carries one Cluster hash
    tag, so each change is one Lua script, atomic, even on a Cluster:

    - `<prefix>{<tag>}:s:<token digest>`: hash of one session (user, device_id, created_ts,
      last_seen_ip, last_seen_ts, expires_ts, ended_ts, identity_fp, password_fp,
      second_factor); expires with the token;
    - `<prefix>{<tag>}:d:<device id>`: set of the digests of the device's open sessions;
    - `<prefix>{<tag>}:devices`: hash device id -> display name, of devices with open sessions;
    - `<prefix>users`: set of users with sessions (for the sweep of removed users);
    - `<prefix>{<tag>}:p:<id>`, `<prefix>{<tag>}:pages`, `<prefix>rl:<bucket>`,
      `<prefix>delegation:*`, `<prefix>oauth:*`, `<prefix>lt:<digest>`, `<prefix>synapse:*`,
      `<prefix>{<tag>}:mfa`, `<prefix>mfa:*`: the other parts' (browser.py, buckets.py,
      delegation.py, oauth.py, oauth_device.py, login_tokens.py, imported.py, factors.py).

    The tag is a digest of the user name, so no name can break out of it (part.user_base).
    """

    name = "redis"

    def __init__(self, connection: RedisConnection, key_prefix: str, keep_ended: float) -> None:
        super().__init__(connection, key_prefix)
        self.keep_ended_ms = int(keep_ended * 1000)
        # The other parts, on the same connection and prefix.
        self._oauth = RedisOAuthStore(
            connection, key_prefix + "oauth:", sessions=self, session_key=self.session_key
        )
        self._browser_sessions = RedisBrowserSessions(connection, key_prefix)
        self._buckets = RedisRateBuckets(connection, key_prefix)
        self._delegation = RedisDelegationState(connection, key_prefix)
        self._login_tokens = RedisLoginTokens(connection, key_prefix)
        self._imported = RedisImportedState(
            connection, key_prefix, sessions=self, open_call=self.open_call, oauth=self._oauth
        )
        self._factors = RedisFactorStore(connection, key_prefix)

    @classmethod
    def from_config(cls, options: dict[str, Any], *, config_dir: str) -> RedisSessionStore:
        if "{" in options["key_prefix"] or "}" in options["key_prefix"]:
            raise ConfigError("sessions.redis.key_prefix: must not hold { or } (they would change the hash tags)")
        connection = RedisConnection(options, section="sessions.redis", store=STORE)
        return cls(connection, options["key_prefix"], options["keep_ended"])

    # -- keys -----------------------------------------------------------------------

    def base(self, user: str) -> str:
        """The part every key of `user` starts with, hash tag included."""
        return user_base(self.prefix, user)

    def session_key(self, user: str, token_hash: str) -> str:
        return f"{self.base(user)}s:{token_hash}"

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        await self.connection.start()

    async def close(self) -> None:
        await self.connection.close()

    async def check_health(self) -> None:
        with self.connection.errors():
            await self.connection.connect().ping()

    # -- the other parts ------------------------------------------------------------

    def oauth(self) -> RedisOAuthStore:
        return self._oauth

    def browser_sessions(self) -> RedisBrowserSessions:
        return self._browser_sessions

    def buckets(self) -> RedisRateBuckets:
        return self._buckets

    def delegation(self) -> RedisDelegationState:
        return self._delegation

    def login_tokens(self) -> RedisLoginTokens:
        return self._login_tokens

    def imported(self) -> RedisImportedState:
        return self._imported

    def factors(self) -> RedisFactorStore:
        return self._factors

    # -- sessions -------------------------------------------------------------------

    def open_call(self, session: Session, display_name: str | None) -> tuple[list[str], list[Any]]:
        """The keys and arguments of the OPEN script for a session (`open`, and a move's batch)."""
        base = self.base(session.user)
        return (
            [f"{base}s:{session.token_hash}", f"{base}d:{session.device_id}", f"{base}devices"],
            [
                session.user, session.device_id, session.created_ts, session.last_seen_ip, session.last_seen_ts,
                session.expires_ts or "", display_name or "", session.token_hash,
                session.identity_fp or "", session.password_fp or "", session.second_factor,
            ],
        )

    async def open(self, session: Session, display_name: str | None) -> None:
        await self.script(OPEN, *self.open_call(session, display_name))
        with self.connection.errors():
            await self.connection.connect().sadd(f"{self.prefix}users", session.user)

    async def get(self, user: str, token_hash: str) -> Session | None:
        fields = await self.connection.hgetall(self.session_key(user, token_hash))
        if not fields:
            return None  # never seen, or expired with its token
        record = {k.decode(): v.decode("utf-8", "replace") for k, v in fields.items()}
        if record.get("user") != user:
            return None

        def number(name: str) -> int | None:
            value = record.get(name)
            return int(value) if value else None

        return Session(
            token_hash=token_hash,
            user=user,
            device_id=record.get("device_id", ""),
            created_ts=number("created_ts") or 0,
            last_seen_ip=record.get("last_seen_ip", ""),
            last_seen_ts=number("last_seen_ts") or 0,
            expires_ts=number("expires_ts"),
            ended_ts=number("ended_ts"),
            identity_fp=record.get("identity_fp"),
            password_fp=record.get("password_fp"),
            second_factor=record.get("second_factor", ""),
        )

    async def touch(self, user: str, token_hash: str, ip: str, ts: int) -> None:
        await self.script(TOUCH, [self.session_key(user, token_hash)], [ip, ts])

    async def end(self, user: str, token_hash: str) -> bool:
        ended = await self.script(
            END, [self.session_key(user, token_hash)], [user, self.keep_ended_ms, self.base(user)]
        )
        return bool(ended)

    async def end_devices(self, user: str, device_ids: list[str] | None) -> int:
        base = self.base(user)
        args: list[Any] = [self.keep_ended_ms, base, "1" if device_ids is None else "0"]
        return int(await self.script(END_DEVICES, [f"{base}devices"], args + list(dict.fromkeys(device_ids or []))))

    async def end_stale(self, user: str, identity_fps: list[str], password_fps: list[str] | None) -> list[str]:
        base = self.base(user)
        args: list[Any] = [self.keep_ended_ms, base, *fingerprint_rule_args(identity_fps, password_fps)]
        ended = await self.script(END_STALE, [f"{base}devices"], args)
        return [text(device) for device in ended]

    async def refingerprint(
        self, user: str, identity_fps: list[str], password_fps: list[str] | None, new: tuple[str, str] | None
    ) -> int:
        base = self.base(user)
        args: list[Any] = [base, *(new or ("", "")), *fingerprint_rule_args(identity_fps, password_fps)]
        return int(await self.script(REFINGERPRINT, [f"{base}devices"], args))

    # -- devices --------------------------------------------------------------------

    async def _devices(self, user: str, device_id: str | None) -> list[Device]:
        base = self.base(user)
        flat = await self.script(DEVICES, [f"{base}devices"], [base, device_id or ""])
        devices = []
        for i in range(0, len(flat), 5):
            device, name, ip, ts, factor = (
                item.decode("utf-8", "replace") if isinstance(item, bytes) else item for item in flat[i : i + 5]
            )
            devices.append(Device(device, name, ip, int(ts), factor))
        return sorted(devices, key=lambda d: d.device_id)

    async def devices(self, user: str) -> list[Device]:
        return await self._devices(user, None)

    async def device(self, user: str, device_id: str) -> Device | None:
        found = await self._devices(user, device_id)
        return found[0] if found else None

    async def rename_device(self, user: str, device_id: str, display_name: str) -> bool:
        base = self.base(user)
        return bool(await self.script(RENAME, [f"{base}devices"], [base, device_id, display_name]))

    async def users(self) -> list[str]:
        client = self.connection.connect()
        with self.connection.errors():
            names = [text(n) for n in await client.smembers(f"{self.prefix}users")]
        found = []
        for name in sorted(names):
            if await self.devices(name):
                found.append(name)
            else:
                with self.connection.errors():
                    await client.srem(f"{self.prefix}users", name)
        return found
