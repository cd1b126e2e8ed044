"""Sentinel and Cluster modes against real redis-server processes, including failover and a lost node."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
import redis.cluster

from backends.base import User, UserExists
from homeserver.errors import StoreDataError
from tests.backends.test_redis_faults import FAULT_BOUND
from tests.backends.test_redis_parity import LOGIN, PROFILE, WHOAMI, login_body
from tests.support.helpers import assert_error, assert_json, record
from tests.support.redis_servers import Store, make_store

FAILOVER_BOUND = 30.0


async def poll_until_ok(fetch, path, method="GET", bound=FAILOVER_BOUND, **kwargs):
    """Retry while the store is unavailable (each try must be a quick 503), until 200."""
    deadline = time.monotonic() + bound
    while True:
        started = time.monotonic()
        resp = await fetch(path, method, **kwargs)
        if resp.status == 200:
            return resp
        assert_error(resp, 503, "M_UNKNOWN")
        assert "Retry-After" in resp.headers, resp
        assert time.monotonic() - started < FAULT_BOUND
        assert time.monotonic() < deadline, f"{path} still unavailable after {bound}s"
        await asyncio.sleep(0.2)


# -- Sentinel ------------------------------------------------------------------------


class TestSentinel:
    @pytest.fixture
    def ha_redis_users(self, sentinel_setup, user_records):
        ha_redis_users = make_store(sentinel_setup.master.url)
        for rec in user_records:
            ha_redis_users.put_record(rec)
        # Let the replica have the users before any failover.
        assert ha_redis_users.client.execute_command("WAIT", 1, 2000) == 1
        yield ha_redis_users
        ha_redis_users.client.close()

    @pytest.fixture
    def config_overrides(self, sentinel_setup, ha_redis_users):
        return {
            "backend": {"type": "redis"},
            "backend.redis": {
                "mode": "sentinel",
                "sentinels": [f"127.0.0.1:{sentinel_setup.sentinel.port}"],
                "service_name": sentinel_setup.service,
                "key_prefix": ha_redis_users.prefix,
            },
        }

    async def test_login_through_sentinel_and_survive_failover(self, sentinel_setup, fetch, login):
        token = (await login())["access_token"]
        assert_json(await fetch(WHOAMI, token=token))
        sentinel_setup.master.stop()
        # The sentinel promotes the replica; the client follows it without a restart.
        await poll_until_ok(fetch, PROFILE + "@alice:localhost")
        assert sentinel_setup.master_port() == sentinel_setup.replica.port
        assert (await login())["user_id"] == "@alice:localhost"
        assert_json(await fetch(WHOAMI, token=token))

    async def test_add_user_and_case_insensitive_lookup(self, backend, ha_redis_users):
        await backend.add_user(User(name="sam", ident="-s", password=record("sam")["password"]))
        with pytest.raises(UserExists):
            await backend.add_user(User(name="sam", ident="-t", password="00"))
        assert (await backend.get_user("SAM", case_insensitive=True)).ident == "-s"
        assert ha_redis_users.get("sam")["ident"] == "-s"


# -- Cluster -------------------------------------------------------------------------

NAMES = [f"user{i}" for i in range(12)]  # enough names to land on all three nodes


@pytest.fixture
def cluster_store(redis_cluster):
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=redis_cluster.nodes[0].port, socket_timeout=2)
    ha_redis_users = Store(redis_cluster.nodes[0].url, "test:cluster:", client)  # type: ignore[arg-type]
    yield ha_redis_users
    client.close()


class TestCluster:
    @pytest.fixture
    def ha_redis_users(self, cluster_store, user_records):
        for rec in [*user_records, *(record(name, ident=f"={name}") for name in NAMES)]:
            cluster_store.put_record(rec)
        return cluster_store

    @pytest.fixture
    def config_overrides(self, redis_cluster, ha_redis_users):
        return {
            "backend": {"type": "redis"},
            "backend.redis": {
                "mode": "cluster",
                "url": redis_cluster.nodes[0].url,
                "cluster_nodes": redis_cluster.addresses[1:],
                "key_prefix": ha_redis_users.prefix,
            },
        }

    async def test_users_on_every_node(self, redis_cluster, ha_redis_users, fetch, login):
        nodes = {ha_redis_users.client.keyslot(ha_redis_users.prefix + name) // 5462 for name in NAMES}
        assert nodes == {0, 1, 2}  # the names really spread over the three nodes
        for name in NAMES:
            assert assert_json(await fetch(PROFILE + f"@{name}:localhost")) == {"displayname": f"={name}"}
        assert (await login("ALICE", "wonderland"))["user_id"] == "@alice:localhost"
        resp = await fetch(LOGIN, "POST", json_body=login_body("user3", "wrong"))
        assert_error(resp, 403, "M_FORBIDDEN", "Invalid username or password")

    async def test_add_user_and_bad_data(self, backend, ha_redis_users):
        await backend.add_user(User(name="zed", ident="-z", password="00"))
        with pytest.raises(UserExists):
            await backend.add_user(User(name="zed", ident="-y", password="00"))
        await backend.add_user(User(name="zed", ident="-y", password="00"), overwrite=True)
        assert ha_redis_users.get("zed") == {"ident": "-y", "password": "00"}
        ha_redis_users.client.set(ha_redis_users.prefix + "str", "x")
        with pytest.raises(StoreDataError, match="is not a hash"):
            await backend.get_user("str")

    async def test_lost_node_gives_503_then_recovers(self, redis_cluster, ha_redis_users, user_records, fetch):
        owner = next(
            node for node in redis_cluster.nodes
            if node.client().cluster("countkeysinslot", ha_redis_users.client.keyslot(ha_redis_users.prefix + "alice"))
        )
        assert_json(await fetch(PROFILE + "@alice:localhost"))
        owner.stop()
        started = time.monotonic()
        resp = await fetch(PROFILE + "@alice:localhost")
        assert_error(resp, 503, "M_UNKNOWN")
        assert time.monotonic() - started < FAULT_BOUND
        assert_json(await fetch("/_matrix/client/versions"))
        owner.start()  # same port and nodes.conf: it rejoins, with no data
        redis_cluster.wait_ok()
        ha_redis_users.put_record(user_records[0])
        await poll_until_ok(fetch, PROFILE + "@alice:localhost")
