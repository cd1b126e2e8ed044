"""Redis user backend: one hash per user, read through redis-py's asyncio client."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from backends.base import StoreDataError, StoreUnavailable, User, UserBackend, UserExists
from backends.redis_connect import RedisConnection

logger = logging.getLogger(__name__)

# Create or replace the user's hash in one step, so concurrent add-user runs cannot
# both "win" and an overwrite never leaves fields of the old record behind.
# KEYS[1] the hash; ARGV[1] "1" to overwrite; ARGV[2..] field, value pairs.
ADD_USER_SCRIPT = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  if ARGV[1] ~= '1' then return 0 end
  redis.call('DEL', KEYS[1])
end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
return 1
"""


class HgetallBatcher:
    """Sends the HGETALLs asked for in one event-loop turn as one pipeline.

    redis-py spends ~150 us of CPU on each command's round trip; in a pipeline of 10 it
    is ~60 us a command (docs/performance.md). Each caller still gets its own reply (or
    its own error) for its own key, read after it asked: no caching, nothing goes stale.
    """

    def __init__(self, client: Redis) -> None:
        self.client = client
        self._pending: list[tuple[str, asyncio.Future[Any]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def hgetall(self, key: str) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if not self._pending:
            # Runs after the callbacks already queued: the other requests of this turn.
            loop.call_soon(self._flush)
        self._pending.append((key, future))
        return await future

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        task = asyncio.ensure_future(self._send(batch))
        self._tasks.add(task)  # keep a reference until it is done
        task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[tuple[str, asyncio.Future[Any]]]) -> None:
        try:
            if len(batch) == 1:
                replies: list[Any] = [await self.client.hgetall(batch[0][0])]
            else:
                pipe = self.client.pipeline(transaction=False)
                for key, _ in batch:
                    pipe.hgetall(key)
                # Errors come back per command, so one bad key fails only its own request.
                replies = await pipe.execute(raise_on_error=False)
        except BaseException as exc:  # connection trouble: every caller gets it
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        for (_, future), reply in zip(batch, replies):
            if future.done():
                continue
            if isinstance(reply, BaseException):
                future.set_exception(reply)
            else:
                future.set_result(reply)


class RedisBackend(UserBackend):
    """Users as Redis hashes at `<key_prefix><name>`, on a standalone server, Sentinel or Cluster."""

    name = "redis"

    def __init__(self, connection: RedisConnection, key_prefix: str) -> None:
        self.connection = connection
        self.key_prefix = key_prefix
        self._batcher: HgetallBatcher | None = None

    @classmethod
    def from_config(cls, options: dict[str, Any], *, config_dir: str) -> "RedisBackend":
        return cls(RedisConnection(options, section="backend.redis", store="user store"), options["key_prefix"])

    @property
    def client(self) -> Redis | RedisCluster | None:
        return self.connection.client

    async def start(self) -> None:
        """Create this process's client (after any fork) and report whether Redis answers."""
        client = self.connection.connect()
        # A cluster routes each key to its node itself; batch on one server (or Sentinel's master).
        if not isinstance(client, RedisCluster):
            self._batcher = HgetallBatcher(client)
        try:
            await self.check_health()
        except StoreUnavailable as exc:
            # Serve anyway: lookups answer 503 until Redis is back, then recover by themselves.
            logger.warning("Redis user store (%s) not reachable yet: %s", self.connection.where(), exc)
        else:
            logger.info("Redis user store (%s) reachable", self.connection.where())

    async def close(self) -> None:
        self._batcher = None
        await self.connection.close()

    def _redis(self) -> Redis | RedisCluster:
        if self.client is None:
            raise RuntimeError("RedisBackend used before start()")
        return self.client

    # -- users --------------------------------------------------------------------

    def key(self, name: str) -> str:
        """The hash key of `name`. The service never passes a name no account can have
        (homeserver.names.possible_name), so no odd key is ever built."""
        return self.key_prefix + name

    async def check_health(self) -> None:
        with self.connection.errors():
            await self._redis().ping()

    async def get_user(self, name: str, *, case_insensitive: bool = False) -> User | None:
        """HGETALL the user's hash; with `case_insensitive`, then the lower-cased name's."""
        user = await self._lookup(name)
        if user is None and case_insensitive and name.lower() != name:
            user = await self._lookup(name.lower())
        return user

    async def _lookup(self, name: str) -> User | None:
        key = self.key(name)
        with self.connection.errors(key):
            if self._batcher is not None and self.client is not None:
                fields = await self._batcher.hgetall(key)
            else:
                fields = await self._redis().hgetall(key)
        if not fields:
            return None
        try:
            record = {k.decode("utf-8"): v.decode("utf-8") for k, v in fields.items()}
        except UnicodeDecodeError:
            raise StoreDataError(f"Redis key {key!r}: a field is not UTF-8 text") from None
        missing = [field for field in ("password", "ident") if field not in record]
        if missing:
            raise StoreDataError(f"Redis key {key!r}: missing field {', '.join(missing)}")
        return User(
            name=name,
            password=record["password"],
            ident=record["ident"],
            display_name=record.get("display_name"),
            avatar_url=record.get("avatar_url"),
        )

    async def add_user(self, user: User, *, overwrite: bool = False) -> None:
        key = self.key(user.name)
        self.connection.connect()  # the CLI provisions without start()
        fields = {"password": user.password or "", "ident": user.ident}
        if user.display_name is not None:
            fields["display_name"] = user.display_name
        if user.avatar_url is not None:
            fields["avatar_url"] = user.avatar_url
        args = ["1" if overwrite else "0", *(part for pair in fields.items() for part in pair)]
        with self.connection.errors(key):
            created = await self._redis().eval(ADD_USER_SCRIPT, 1, key, *args)
        if not created:
            raise UserExists(user.name)
        logger.info("stored user %r at Redis key %r", user.name, key)
