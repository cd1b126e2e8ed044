"""Redis user backend: one hash per user, read through redis-py's asyncio client."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import Any, Collection, Iterator

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import SSLConnection, parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import RedisClusterException, RedisError, ResponseError

from backends.base import ConfigError, StoreDataError, StoreUnavailable, User, UserBackend, UserExists, UserIncomplete

logger = logging.getLogger(__name__)

# Create or replace the user's hash in one step, so concurrent add-user runs cannot both
# "win". KEYS[1] the hash; ARGV[1] "1" to overwrite; ARGV[2] "1" if the user must exist
# (its password or ident is kept); ARGV[3] n, then the n fields an overwrite removes;
# then field, value pairs to set. Other fields of an existing hash stay as they are.
# Returns 0 (exists, no overwrite), 1 (added), 2 (replaced) or -1 (must exist, does not).
ADD_USER_SCRIPT = """
local exists = redis.call('EXISTS', KEYS[1]) == 1
if exists and ARGV[1] ~= '1' then return 0 end
if not exists and ARGV[2] == '1' then return -1 end
local n = tonumber(ARGV[3])
if exists and n > 0 then redis.call('HDEL', KEYS[1], unpack(ARGV, 4, 3 + n)) end
if #ARGV > 3 + n then redis.call('HSET', KEYS[1], unpack(ARGV, 4 + n)) end
if exists then return 2 end
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


def parse_address(where: str, text: str, default_port: int) -> tuple[str, int]:
    """Split "host:port" ("[::1]:port", or a bare host) for a config key; ConfigError if malformed."""
    host, port = text, str(default_port)
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            port = rest.removeprefix(":")
    elif text.count(":") == 1:
        host, port = text.split(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{where}: expected \"host:port\", got {text!r}")
    return host, int(port)


class RedisBackend(UserBackend):
    """Users as Redis hashes at `<key_prefix><name>`, on a standalone server, Sentinel or Cluster."""

    name = "redis"

    def __init__(self, options: dict[str, Any], url_kwargs: dict[str, Any]) -> None:
        self.options = options
        self.url_kwargs = url_kwargs
        self.key_prefix: str = options["key_prefix"]
        self.retry_after: int = options["retry_after"]
        self.client: Redis | RedisCluster | None = None
        self._sentinel: Sentinel | None = None
        self._batcher: HgetallBatcher | None = None

    @classmethod
    def from_config(cls, options: dict[str, Any], *, config_dir: str) -> "RedisBackend":
        try:
            url_kwargs = dict(parse_url(options["url"]))
        except ValueError as exc:
            raise ConfigError(f"backend.redis.url: {exc}") from None
        mode = options["mode"]
        if mode == "sentinel":
            if not options["sentinels"]:
                raise ConfigError("backend.redis.sentinels: list at least one sentinel for mode = \"sentinel\"")
            if not options["service_name"]:
                raise ConfigError("backend.redis.service_name: must not be empty for mode = \"sentinel\"")
        if mode == "cluster" and ("path" in url_kwargs or url_kwargs.get("db")):
            raise ConfigError("backend.redis.url: a cluster has no unix sockets and only database 0")
        # Check the node lists now, so a typo stops start-up rather than the first login.
        for key, port in (("sentinels", 26379), ("cluster_nodes", 6379)):
            for text in options[key]:
                parse_address(f"backend.redis.{key}", text, port)
        return cls(options, url_kwargs)

    # -- connection ---------------------------------------------------------------

    def _connection_kwargs(self) -> dict[str, Any]:
        """Bounded timeouts and few retries: a dead Redis turns into a 503 within seconds."""
        opts = self.options
        return {
            "socket_connect_timeout": opts["connect_timeout"],
            "socket_timeout": opts["socket_timeout"],
            "retry": Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.25), opts["retries"]),
            "health_check_interval": opts["health_check_interval"],
        }

    def _make_client(self) -> Redis | RedisCluster:
        opts, common = self.options, self._connection_kwargs()
        if opts["mode"] == "sentinel":
            # The master's address comes from the sentinels; the URL still gives the
            # database, the credentials and TLS (rediss://) for the master itself.
            master = {k: v for k, v in self.url_kwargs.items() if k not in ("host", "port", "path")}
            if master.pop("connection_class", None) is SSLConnection:
                master["ssl"] = True
            sentinel_kwargs = dict(common, password=opts["sentinel_password"] or None)
            self._sentinel = Sentinel(
                [parse_address("sentinels", s, 26379) for s in opts["sentinels"]],
                sentinel_kwargs=sentinel_kwargs,
            )
            return self._sentinel.master_for(
                opts["service_name"], **{"max_connections": opts["max_connections"], **common, **master}
            )
        if opts["mode"] == "cluster":
            nodes = [ClusterNode(*parse_address("cluster_nodes", n, 6379)) for n in opts["cluster_nodes"]]
            return RedisCluster.from_url(
                opts["url"], startup_nodes=nodes or None, max_connections=opts["max_connections"], **common
            )
        # Requests wait (up to socket_timeout) for a free connection instead of failing.
        # Options in the URL's query win, as with redis-py's own from_url.
        pool_kwargs = {"max_connections": opts["max_connections"], "timeout": opts["socket_timeout"]}
        pool = BlockingConnectionPool(**{**pool_kwargs, **common, **self.url_kwargs})
        return Redis.from_pool(pool)

    def _where(self) -> str:
        """Name the Redis in use for log lines (never its password)."""
        opts = self.options
        if opts["mode"] == "sentinel":
            return f"sentinel service {opts['service_name']!r} via {', '.join(opts['sentinels'])}"
        kw = self.url_kwargs
        url = kw.get("path") or f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}"
        if opts["mode"] == "cluster":
            return f"cluster via {', '.join([url, *opts['cluster_nodes']])}"
        return url

    async def start(self) -> None:
        """Create this process's client (after any fork) and report whether Redis answers."""
        self.client = self._make_client()
        # A cluster routes each key to its node itself; batch on one server (or Sentinel's master).
        if not isinstance(self.client, RedisCluster):
            self._batcher = HgetallBatcher(self.client)
        try:
            await self.check_health()
        except StoreUnavailable as exc:
            # Serve anyway: lookups answer 503 until Redis is back, then recover by themselves.
            logger.warning("Redis user store (%s) not reachable yet: %s", self._where(), exc)
        else:
            logger.info("Redis user store (%s) reachable", self._where())

    async def close(self) -> None:
        client, sentinel, self.client, self._sentinel = self.client, self._sentinel, None, None
        self._batcher = None
        if client is not None:
            await client.aclose()
        if sentinel is not None:
            await sentinel.aclose()

    @contextlib.contextmanager
    def _errors(self, key: str | None = None) -> Iterator[None]:
        """Turn Redis failures into StoreUnavailable (503) and a wrong key type into StoreDataError."""
        try:
            yield
        except ResponseError as exc:
            if key is not None and str(exc).startswith("WRONGTYPE"):
                raise StoreDataError(f"Redis key {key!r} is not a hash") from None
            raise StoreUnavailable(f"Redis ({self._where()}): {exc}", self.retry_after) from None
        except (RedisError, RedisClusterException) as exc:
            raise StoreUnavailable(f"Redis ({self._where()}): {exc}", self.retry_after) from None

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
        with self._errors():
            await self._redis().ping()

    async def get_user(self, name: str, *, case_insensitive: bool = False) -> User | None:
        """HGETALL the user's hash; with `case_insensitive`, then the lower-cased name's."""
        user = await self._lookup(name)
        if user is None and case_insensitive and name.lower() != name:
            user = await self._lookup(name.lower())
        return user

    async def _lookup(self, name: str) -> User | None:
        key = self.key(name)
        with self._errors(key):
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

    async def add_user(self, user: User, *, overwrite: bool = False, keep: Collection[str] = ()) -> bool:
        key = self.key(user.name)
        if self.client is None:  # the CLI provisions without serving
            self.client = self._make_client()
        # The hash holds every field of User but the name (it is in the key).
        fields = {f.name: getattr(user, f.name) for f in dataclasses.fields(User) if f.name not in ("name", *keep)}
        if "password" in fields:
            fields["password"] = fields["password"] or ""
        removed = [name for name, value in fields.items() if value is None]
        pairs = [part for name, value in fields.items() if value is not None for part in (name, value)]
        must_exist = "1" if {"password", "ident"} & set(keep) else "0"
        args = ["1" if overwrite else "0", must_exist, str(len(removed)), *removed, *pairs]
        with self._errors(key):
            outcome = await self._redis().eval(ADD_USER_SCRIPT, 1, key, *args)
        if outcome == 0:
            raise UserExists(user.name)
        if outcome == -1:
            raise UserIncomplete(user.name, [k for k in ("password", "ident") if k in keep])
        logger.info("stored user %r at Redis key %r", user.name, key)
        return outcome == 2
