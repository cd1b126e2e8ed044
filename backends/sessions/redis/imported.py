"""`ImportedState` in the session Redis: `<prefix>synapse:tokens` (hash: the digest of every token a
move from Synapse carried -> its user) and `<prefix>synapse:deactivated` (set of the users Synapse
had deactivated). A batch's sessions and grants are written with the session store's and the OAuth
store's own keys (`RedisSessionStore.open_call`, `RedisOAuthStore.grant_keys`): in one MULTI/EXEC on
a standalone or Sentinel Redis (all of the batch or none of it); on a Cluster, whose keys of many
users sit on many nodes, in one pipeline with the bookkeeping after it, so a batch cut short is
written again, whole, by the next run."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from redis.asyncio.cluster import RedisCluster

from backends.redis_connect import RedisConnection, load_in_transaction, text
from backends.sessions.base import SessionStore
from backends.sessions.imported import ImportBatch, ImportedState
from backends.sessions.records import Session
from backends.sessions.redis.oauth import RedisOAuthStore
from backends.sessions.redis.part import RedisPart, user_base
from backends.sessions.redis.scripts import OPEN

OpenCall = Callable[[Session, "str | None"], "tuple[list[str], list[Any]]"]

CHUNK = 500  # digests asked in one HMGET; a Cluster's sessions opened at once (at most)


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


class RedisImportedState(RedisPart, ImportedState):
    """The move's bookkeeping beside the sessions: a part of RedisSessionStore."""

    def __init__(
        self, connection: RedisConnection, prefix: str, *, sessions: SessionStore, open_call: OpenCall,
        oauth: RedisOAuthStore,
    ) -> None:
        super().__init__(connection, prefix)
        self.sessions = sessions  # the store itself: a device looked at forgets it when no session is left
        self.open_call = open_call  # RedisSessionStore.open_call: the OPEN script's keys and arguments
        self.oauth = oauth
        self.tokens_key = f"{prefix}synapse:tokens"
        self.deactivated_key = f"{prefix}synapse:deactivated"

    def _bookkeeping(self, pipe: Any, batch: ImportBatch) -> None:
        if batch.tokens:
            pipe.hset(self.tokens_key, mapping=dict(batch.tokens))
        if batch.deactivated:
            pipe.sadd(self.deactivated_key, *batch.deactivated)

    async def add(self, batch: ImportBatch) -> None:
        client = self.connection.connect()
        cluster = isinstance(client, RedisCluster)
        if cluster:  # a Cluster pipelines no scripts: each session's, some at a time
            step = self.connection.cluster_in_flight(CHUNK)
            for start in range(0, len(batch.sessions), step):
                chunk = batch.sessions[start:start + step]
                await asyncio.gather(*(self.script(OPEN, *self.open_call(s, name)) for s, name in chunk))
        with self.connection.errors():
            pipe = client.pipeline(transaction=not cluster)
            if not cluster and batch.sessions:
                sha = load_in_transaction(pipe, OPEN)
                for session, name in batch.sessions:
                    keys, args = self.open_call(session, name)
                    pipe.evalsha(sha, len(keys), *keys, *args)
            users = sorted({session.user for session, _ in batch.sessions})
            if users:
                pipe.sadd(f"{self.prefix}users", *users)
            for grant, idle in batch.grants:
                for key, value in self.oauth.grant_keys(grant):
                    pipe.set(key, value, px=_ms(idle))
            if cluster:
                await pipe.execute()
                pipe = client.pipeline(transaction=False)
            self._bookkeeping(pipe, batch)
            await pipe.execute()

    async def undo(self, batch: ImportBatch) -> None:
        client = self.connection.connect()
        with self.connection.errors():
            for session, _ in batch.sessions:
                base = user_base(self.prefix, session.user)
                await client.delete(f"{base}s:{session.token_hash}")
                await client.srem(f"{base}d:{session.device_id}", session.token_hash)
        for user, device_id in sorted({(s.user, s.device_id) for s, _ in batch.sessions}):
            await self.sessions.device(user, device_id)  # forgets the device when no session is left
        for grant, _ in batch.grants:
            await self.oauth.delete_grant(grant)
        if batch.tokens:
            with self.connection.errors():
                await client.hdel(self.tokens_key, *(digest for digest, _ in batch.tokens))

    async def known_tokens(self, digests: list[str]) -> set[str]:
        client = self.connection.connect()
        found: set[str] = set()
        for start in range(0, len(digests), CHUNK):
            chunk = digests[start:start + CHUNK]
            with self.connection.errors():
                values = await client.hmget(self.tokens_key, chunk)
            found.update(digest for digest, value in zip(chunk, values, strict=True) if value is not None)
        return found

    async def token_user(self, token_hash: str) -> str | None:
        with self.connection.errors():
            value = await self.connection.connect().hget(self.tokens_key, token_hash)
        return text(value) if value is not None else None

    async def is_deactivated(self, user: str) -> bool:
        with self.connection.errors():
            return bool(await self.connection.connect().sismember(self.deactivated_key, user))

    async def deactivated_users(self) -> set[str]:
        with self.connection.errors():
            return {text(name) for name in await self.connection.connect().smembers(self.deactivated_key)}
