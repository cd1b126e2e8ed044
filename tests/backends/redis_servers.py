"""Private redis-server, sentinel and cluster processes on loopback ports, plus store fixtures."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator

import pytest
import redis

from tests.helpers import ci

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
SHARED_URL = "redis://127.0.0.1:6379/0"


def unavailable(reason: str) -> None:
    """Skip the test for want of Redis, but fail it on CI, where Redis must be there."""
    if ci():
        pytest.fail(f"{reason} (CI is set: the Redis tests must run)")
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(check: Any, timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll `check()` until it returns something truthy (exceptions count as not yet)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
            if result:
                return result
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@dataclass
class RedisProcess:
    """One redis-server (or sentinel) we started; stop, pause, resume or restart it."""

    workdir: str
    args: list[str]
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2, retry=None)

    def start(self) -> "RedisProcess":
        os.makedirs(self.workdir, exist_ok=True)
        argv = [REDIS_SERVER, *self.args, "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", self.workdir,
                "--logfile", os.path.join(self.workdir, "redis.log")]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with self.client() as c:
            wait_until(c.ping, what=f"redis on port {self.port}")
        return self

    def stop(self) -> None:
        """SIGTERM and wait (a paused server is resumed first so it can exit)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)


def require_redis_server() -> None:
    if not os.access(REDIS_SERVER, os.X_OK):
        unavailable(f"redis-server not found at {REDIS_SERVER} (scripts/install-test-services.sh installs it)")


def start_server(workdir: str, *args: str) -> RedisProcess:
    require_redis_server()
    return RedisProcess(workdir, list(args)).start()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory) -> Iterator[str]:
    """A Redis for the whole session: a private redis-server, else the one on 127.0.0.1:6379."""
    if os.access(REDIS_SERVER, os.X_OK):
        server = RedisProcess(str(tmp_path_factory.mktemp("redis")), []).start()
        yield server.url
        server.stop()
        return
    try:
        with redis.Redis.from_url(SHARED_URL, socket_timeout=1, retry=None) as c:
            c.ping()
    except redis.RedisError as exc:
        unavailable(f"no redis-server binary and no Redis at {SHARED_URL} ({exc})")
    yield SHARED_URL


@pytest.fixture
def redis_server(tmp_path) -> Iterator[RedisProcess]:
    """A private redis-server for this test alone (fault tests stop and pause it)."""
    server = start_server(str(tmp_path / "redis"))
    yield server
    server.stop()


@dataclass
class Store:
    """Direct access to the test's keys: a sync client and the test's own key prefix."""

    url: str
    prefix: str
    client: redis.Redis

    def put(self, name: str, **fields: str) -> None:
        self.client.hset(self.prefix + name, mapping=fields)

    def put_record(self, record: dict[str, Any]) -> None:
        self.put(record["name"], **{k: v for k, v in record.items() if k != "name" and v is not None})

    def get(self, name: str) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.client.hgetall(self.prefix + name).items()}

    def clear(self) -> None:
        for key in self.client.scan_iter(match=self.prefix + "*"):
            self.client.delete(key)


def make_store(url: str) -> Store:
    return Store(url, f"test:{uuid.uuid4().hex}:", redis.Redis.from_url(url, socket_timeout=2, retry=None))


@pytest.fixture
def store(redis_url, user_records) -> Iterator[Store]:
    """The users of `user_records` as hashes under a fresh key prefix, removed afterwards."""
    store = make_store(redis_url)
    for record in user_records:
        store.put_record(record)
    yield store
    store.clear()
    store.client.close()


def redis_overrides(store: Store, **options: Any) -> dict[str, dict[str, Any]]:
    """config_overrides selecting the Redis backend on `store`."""
    return {"backend": {"type": "redis"}, "backend.redis": {"url": store.url, "key_prefix": store.prefix, **options}}
