"""`UserBackend.add_users`, the move's bulk write: the users a store lacks added in one write (the
users file: one rewrite; Redis: one MULTI/EXEC, a Cluster's per user), those it has left as they
are, the address index kept."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from backends.base import User
from backends.file import FileBackend
from homeserver.config import build_config
from homeserver.context import create_backend
from tests.support.helpers import hex_hash, record
from tests.support.redis_servers import RedisProcess, redis_cluster, redis_server, redis_url, sentinel_setup

__all__ = ["redis_cluster", "redis_server", "redis_url", "sentinel_setup"]

HEX = hex_hash("pw")
NEW = [
    User(name="ann", ident="", password=HEX, email="Ann@Example.org", admin=True, password_scheme="synapse"),
    User(name="alice", ident="", password=HEX),  # the store has an alice: hers stays
    User(name="bo", ident="", password=HEX, locked=True),
]


async def test_into_the_users_file(tmp_path):
    path = tmp_path / "users.json"
    alice = record("alice", "wonderland", " (alice)")
    path.write_text(json.dumps({"users": [alice]}))
    backend = FileBackend(str(path))
    await backend.start()
    assert await backend.add_users(NEW) == ["ann", "bo"]
    records = {r["name"]: r for r in json.loads(path.read_text())["users"]}
    assert records["alice"] == alice
    assert records["ann"] == {"name": "ann", "password": HEX, "ident": "", "email": "Ann@Example.org",
                              "admin": True, "password_scheme": "synapse"}
    assert records["bo"]["locked"] is True
    assert (await backend.get_user("ann")).password_scheme == "synapse"  # this process sees them at once
    assert await backend.add_users(NEW) == []


async def assert_batch_added(backend) -> None:
    """NEW added beside alice (kept as she was), with every field, found by address too; once."""
    assert await backend.add_users(NEW) == ["ann", "bo"]
    assert (await backend.get_user("alice")).password == "aa"
    ann = await backend.get_user("ann")
    assert (ann.admin, ann.password_scheme, ann.email) == (True, "synapse", "Ann@Example.org")
    assert [u.name for u in await backend.get_users_by_email("ann@example.org")] == ["ann"]
    assert (await backend.get_user("bo")).locked
    assert await backend.add_users(NEW) == []


@pytest.mark.parametrize("mode", ["standalone", "cluster"])
async def test_into_redis(mode, request, tmp_path):
    if mode == "cluster":
        cluster = request.getfixturevalue("redis_cluster")
        section = {"url": f"redis://{cluster.addresses[0]}/0", "mode": "cluster", "cluster_nodes": cluster.addresses}
    else:
        section = {"url": request.getfixturevalue("redis_url")}
    prefix = f"test:add-users:{mode}:"
    section.update(key_prefix=prefix, email_key_prefix=prefix + "email:")
    backend = create_backend(build_config({"backend": {"type": "redis", "redis": section}}))
    await backend.start()
    try:
        await backend.add_user(User(name="alice", ident=" (alice)", password="aa"))
        await assert_batch_added(backend)
    finally:
        await backend.close()
        client = (redis.cluster.RedisCluster.from_url(section["url"]) if mode == "cluster"
                  else redis.Redis.from_url(section["url"]))
        for key in client.scan_iter(match=prefix + "*"):
            client.delete(key)
        client.close()


def flush_scripts_before_each_transaction(client: Any, server: RedisProcess, monkeypatch: Any) -> None:
    """Empty the server's script cache (SCRIPT FLUSH) just before each MULTI/EXEC `client` sends:
    what a failover to a fresh master (its cache empty) between a script's load and the
    transaction, or an operator's SCRIPT FLUSH, does to a store."""
    make = client.pipeline

    def pipeline(transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = make(transaction=transaction, shard_hint=shard_hint)
        if transaction:
            execute = pipe.execute

            async def flushed_then_execute(*args: Any, **kwargs: Any) -> Any:
                with server.client() as direct:
                    direct.script_flush()
                return await execute(*args, **kwargs)

            pipe.execute = flushed_then_execute
        return pipe

    monkeypatch.setattr(client, "pipeline", pipeline)


@pytest.mark.parametrize("mode", ["standalone", "sentinel"])
async def test_into_redis_whose_script_cache_is_emptied_before_the_transaction(mode, request, monkeypatch):
    prefix = "test:add-users:flushed:"
    section = {"key_prefix": prefix, "email_key_prefix": prefix + "email:"}
    if mode == "sentinel":
        setup = request.getfixturevalue("sentinel_setup")
        server = setup.master
        section.update(mode="sentinel", sentinels=[f"127.0.0.1:{setup.sentinel.port}"],
                       service_name=setup.service)
    else:
        server = request.getfixturevalue("redis_server")
        section.update(url=server.url)
    backend = create_backend(build_config({"backend": {"type": "redis", "redis": section}}))
    await backend.start()
    try:
        await backend.add_user(User(name="alice", ident=" (alice)", password="aa"))
        flush_scripts_before_each_transaction(backend.connection.connect(), server, monkeypatch)
        await assert_batch_added(backend)
    finally:
        await backend.close()


async def test_a_whole_batch_into_a_redis_cluster(redis_cluster):
    # A batch of the move (importer.BATCH users) is more than a Cluster node's connections
    # (`max_connections`, 100 by default): the scripts must not all be in flight at once.
    prefix = "test:add-users:batch:"
    section = {"url": f"redis://{redis_cluster.addresses[0]}/0", "mode": "cluster",
               "cluster_nodes": redis_cluster.addresses, "key_prefix": prefix, "email_key_prefix": prefix + "email:"}
    backend = create_backend(build_config({"backend": {"type": "redis", "redis": section}}))
    await backend.start()
    try:
        many = [User(name=f"user{i:04}", ident="", password=HEX, email=f"u{i}@example.org") for i in range(1000)]
        assert await backend.add_users(many) == [user.name for user in many]
        assert (await backend.get_user("user0999")).email == "u999@example.org"
    finally:
        await backend.close()
