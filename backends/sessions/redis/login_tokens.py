"""The login tokens in the Redis session store: `<prefix>lt:<digest>`, a string holding the
token's record (JSON), expiring with the token; taken by GETDEL, so once."""

from __future__ import annotations

import time

from backends.sessions.login_tokens import LoginTokenRecord, LoginTokenStore
from backends.sessions.redis.part import RedisPart


class RedisLoginTokens(RedisPart, LoginTokenStore):
    """One key per token (a single-key command each, so any Cluster slot will do)."""

    def _key(self, token_hash: str) -> str:
        return f"{self.prefix}lt:{token_hash}"

    async def add(self, token_hash: str, record: LoginTokenRecord) -> None:
        if record.expires <= time.time():
            return
        with self.connection.errors():
            await self.connection.connect().set(self._key(token_hash), record.encode(), exat=record.expires, nx=True)

    async def take(self, token_hash: str) -> LoginTokenRecord | None:
        with self.connection.errors():
            value = await self.connection.connect().getdel(self._key(token_hash))
        if value is None:
            return None
        record = LoginTokenRecord.decode(value)
        return record if record.expires > time.time() else None
