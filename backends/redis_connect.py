"""Redis connections from a validated config section: standalone, Sentinel or Cluster."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Iterator
from typing import Any, cast

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import SSLConnection, parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import RedisClusterException, RedisError, ResponseError

from backends.base import ConfigError, StoreDataError, StoreUnavailable

logger = logging.getLogger(__name__)


def text(value: bytes | str) -> str:
    """A Redis reply as text (replies are bytes unless the client decodes them)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def load_in_transaction(pipe: Any, script: str) -> str:
    """Queue SCRIPT LOAD of `script` first in the MULTI/EXEC pipeline `pipe`; its SHA1, for the
    EVALSHAs queued after it. Loaded by the transaction itself, the script is there on the
    server that runs the EXEC: a master new since a failover (Sentinel), or a cache flushed
    after a load sent on its own, would answer those EVALSHAs NOSCRIPT, and inside MULTI that
    fails them alone, not retried, while the transaction's other commands are written."""
    pipe.script_load(script)
    return hashlib.sha1(script.encode("utf-8")).hexdigest()


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
        for (_, future), reply in zip(batch, replies, strict=True):
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


class RedisConnection:
    """One process's client to the Redis a config section names (the user backend's
    `[backend.redis]`, the session store's `[sessions.redis]`), with bounded timeouts."""

    def __init__(self, options: dict[str, Any], *, section: str, store: str) -> None:
        self.options = options
        self.section = section
        self.store = store  # "user store" / "session store", for 503 messages
        self.retry_after: int = options["retry_after"]
        self.client: Redis | RedisCluster | None = None
        self._sentinel: Sentinel | None = None
        self._batcher: HgetallBatcher | None = None
        try:
            self.url_kwargs: dict[str, Any] = dict(parse_url(options["url"]))
        except ValueError as exc:
            raise ConfigError(f"{section}.url: {exc}") from None
        mode = options["mode"]
        if mode == "sentinel":
            if not options["sentinels"]:
                raise ConfigError(f"{section}.sentinels: list at least one sentinel for mode = \"sentinel\"")
            if not options["service_name"]:
                raise ConfigError(f"{section}.service_name: must not be empty for mode = \"sentinel\"")
        if mode == "cluster" and ("path" in self.url_kwargs or self.url_kwargs.get("db")):
            raise ConfigError(f"{section}.url: a cluster has no unix sockets and only database 0")
        # Check the node lists now, so a typo stops start-up rather than the first request.
        for key, port in (("sentinels", 26379), ("cluster_nodes", 6379)):
            for text in options[key]:
                parse_address(f"{section}.{key}", text, port)

    def connect(self) -> Redis | RedisCluster:
        """This process's client (made once, after any fork)."""
        if self.client is None:
            self.client = self._make_client()
        return self.client

    async def start(self) -> None:
        """Make this process's client (after any fork) and say whether Redis answers.

        Serves either way: requests answer 503 until Redis is back, then recover by themselves.
        """
        client = self.connect()
        # A cluster routes each key to its node itself; batch on one server (or Sentinel's master).
        if not isinstance(client, RedisCluster):
            self._batcher = HgetallBatcher(client)
        try:
            with self.errors():
                await client.ping()
        except StoreUnavailable as exc:
            logger.warning("Redis %s (%s) not reachable yet: %s", self.store, self.where(), exc)
        else:
            logger.info("Redis %s (%s) reachable", self.store, self.where())

    async def hgetall(self, key: str) -> dict[bytes, bytes]:
        """HGETALL, sent with the others of this event-loop turn in one pipeline."""
        with self.errors(key):
            if self._batcher is not None:
                return await self._batcher.hgetall(key)
            return cast("dict[bytes, bytes]", await self.connect().hgetall(key))

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

    def cluster_in_flight(self, wanted: int) -> int:
        """How many commands of `wanted` one step may have in flight at once on a Cluster: a
        node's connections are `max_connections`, and redis-py's Cluster client refuses one
        more (MaxConnectionsError) rather than wait for one, as the other modes' pool does."""
        return max(1, min(wanted, self.options["max_connections"]))

    def where(self) -> str:
        """Name the Redis in use for log lines (never its password)."""
        opts = self.options
        if opts["mode"] == "sentinel":
            return f"sentinel service {opts['service_name']!r} via {', '.join(opts['sentinels'])}"
        kw = self.url_kwargs
        url = kw.get("path") or f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}"
        if opts["mode"] == "cluster":
            return f"cluster via {', '.join([url, *opts['cluster_nodes']])}"
        return url

    async def close(self) -> None:
        self._batcher = None
        client, sentinel, self.client, self._sentinel = self.client, self._sentinel, None, None
        if client is not None:
            await client.aclose()
        if sentinel is not None:
            await sentinel.aclose()

    @contextlib.contextmanager
    def errors(self, key: str | None = None) -> Iterator[None]:
        """Turn Redis failures into StoreUnavailable (503) and a wrong key type into StoreDataError."""
        try:
            yield
        except ResponseError as exc:
            if key is not None and str(exc).startswith("WRONGTYPE"):
                raise StoreDataError(f"Redis key {key!r} is not a hash") from None
            raise StoreUnavailable(f"Redis ({self.where()}): {exc}", self.retry_after, store=self.store) from None
        except (RedisError, RedisClusterException) as exc:
            raise StoreUnavailable(f"Redis ({self.where()}): {exc}", self.retry_after, store=self.store) from None
