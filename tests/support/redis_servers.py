"""Private redis-server, sentinel and cluster processes on loopback ports, plus store fixtures."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from backends.base import canonical_email
from tests.support.helpers import ci

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
SHARED_URL = "redis://127.0.0.1:6379/0"


def unavailable(reason: str) -> None:
    """Skip the test for want of Redis, but fail it on CI, where Redis must be there."""
    if ci():
        pytest.fail(f"{reason} (CI is set: the Redis tests must run)")
    pytest.skip(reason)


def free_port() -> int:
    """A free loopback port whose +10000 twin (a cluster node's bus port) is free too."""
    for _ in range(100):
        port = random.randrange(20000, 55000)
        try:
            for candidate in (port, port + 10000):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise AssertionError("no free port pair found")


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

    def start(self) -> RedisProcess:
        os.makedirs(self.workdir, exist_ok=True)
        argv = [REDIS_SERVER, *self.args, "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", self.workdir,
                "--logfile", os.path.join(self.workdir, "redis.log")]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            with self.client() as c:
                wait_until(lambda: self.proc.poll() is not None or c.ping(), what=f"redis on port {self.port}")
            if self.proc.poll() is not None:
                raise AssertionError(f"redis-server exited with {self.proc.returncode}; see {self.workdir}/redis.log")
        except BaseException:
            self.stop()
            raise
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

    @property
    def email_prefix(self) -> str:
        return self.prefix[:-1] + "-email:"

    def put_record(self, record: dict[str, Any]) -> None:
        """The user's hash, and its address in the e-mail index as add-user keeps it."""
        self.put(record["name"], **{k: v for k, v in record.items() if k != "name" and v is not None})
        if record.get("email"):
            self.client.sadd(self.email_prefix + canonical_email(record["email"]), record["name"])

    def get(self, name: str) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.client.hgetall(self.prefix + name).items()}

    def clear(self) -> None:
        for pattern in (self.prefix + "*", self.email_prefix + "*"):
            for key in self.client.scan_iter(match=pattern):
                self.client.delete(key)


def make_store(url: str) -> Store:
    return Store(url, f"test:{uuid.uuid4().hex}:", redis.Redis.from_url(url, socket_timeout=2, retry=None))


@pytest.fixture
def redis_users(redis_url, user_records) -> Iterator[Store]:
    """The users of `user_records` as hashes under a fresh key prefix, removed afterwards."""
    redis_users = make_store(redis_url)
    for record in user_records:
        redis_users.put_record(record)
    yield redis_users
    redis_users.clear()
    redis_users.client.close()


def redis_overrides(redis_users: Store, **options: Any) -> dict[str, dict[str, Any]]:
    """config_overrides selecting the Redis backend on `redis_users`."""
    section = {"url": redis_users.url, "key_prefix": redis_users.prefix, "email_key_prefix": redis_users.email_prefix, **options}
    return {"backend": {"type": "redis"}, "backend.redis": section}


@dataclass
class SentinelSetup:
    """A master, a replica and one sentinel (quorum 1) watching them as `service`."""

    master: RedisProcess
    replica: RedisProcess
    sentinel: RedisProcess
    service: str = "mymaster"

    def master_port(self) -> int:
        with self.sentinel.client() as c:
            return int(c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)[1])


def start_sentinel_setup(workdir: str, procs: list[RedisProcess], service: str = "mymaster") -> SentinelSetup:
    """Start the three processes, each added to `procs` at once so a failure still stops them."""
    # No 5 s wait for more replicas before the first sync.
    master = start_server(os.path.join(workdir, "master"), "--repl-diskless-sync-delay", "0")
    procs.append(master)
    replica = start_server(os.path.join(workdir, "replica"), "--replicaof", "127.0.0.1", str(master.port))
    procs.append(replica)
    conf = os.path.join(workdir, "sentinel.conf")
    with open(conf, "w") as fh:
        # Quick failover for the tests: master down after 0.5 s, one sentinel decides.
        fh.write(
            f"sentinel monitor {service} 127.0.0.1 {master.port} 1\n"
            f"sentinel down-after-milliseconds {service} 500\n"
            f"sentinel failover-timeout {service} 5000\n"
        )
    with replica.client() as c:
        # Linked before the sentinel starts, so its first look at the master finds the replica.
        wait_until(lambda: c.info("replication").get("master_link_status") == "up", what="replication")
    sentinel = RedisProcess(os.path.join(workdir, "sentinel"), [conf, "--sentinel"]).start()
    procs.append(sentinel)
    with sentinel.client() as c:
        # The sentinel fails over only to replicas it has found (it asks the master every 10 s).
        wait_until(
            lambda: c.execute_command("SENTINEL", "REPLICAS", service), timeout=20, what="sentinel to see the replica"
        )
    return SentinelSetup(master, replica, sentinel, service)


@dataclass
class ClusterSetup:
    """Three master nodes sharing the 16384 slots."""

    nodes: list[RedisProcess]

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{node.port}" for node in self.nodes]

    def wait_ok(self) -> None:
        for node in self.nodes:
            with node.client() as c:
                wait_until(lambda: c.cluster("info")["cluster_state"] == "ok", what="cluster_state:ok")


def start_cluster(workdir: str, nodes: list[RedisProcess]) -> ClusterSetup:
    """Start three nodes (added to `nodes` at once so a failure still stops them) and join them."""
    require_redis_server()
    if not os.access(REDIS_CLI, os.X_OK):
        unavailable(f"redis-cli not found at {REDIS_CLI}")
    args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "1000"]
    for i in range(3):
        nodes.append(start_server(os.path.join(workdir, f"node{i}"), *args))
    cluster = ClusterSetup(nodes)
    subprocess.run(
        [REDIS_CLI, "--cluster", "create", *cluster.addresses, "--cluster-yes"],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30,
    )
    cluster.wait_ok()
    return cluster


@pytest.fixture
def sentinel_setup(tmp_path) -> Iterator[SentinelSetup]:
    procs: list[RedisProcess] = []
    try:
        yield start_sentinel_setup(str(tmp_path), procs)
    finally:
        for proc in reversed(procs):
            proc.stop()


@pytest.fixture
def redis_cluster(tmp_path) -> Iterator[ClusterSetup]:
    nodes: list[RedisProcess] = []
    try:
        yield start_cluster(str(tmp_path), nodes)
    finally:
        for node in nodes:
            node.stop()
