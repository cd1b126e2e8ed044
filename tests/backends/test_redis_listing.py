"""The Redis listing on real servers: SCAN over the key prefix (and nothing beside it), hashes
read in pipelines of LIST_BATCH, keys of other types left out, a Redis lost part-way, and a
Cluster's users on every node."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis.cluster

from backends.base import StoreIncomplete
from backends.redis import LIST_BATCH
from tests.backends.test_redis_batching import count_pipelines
from tests.support.helpers import record
from tests.support.redis_servers import Store, make_store, redis_overrides

MANY = 1234  # several batches and a part


def fill(store: Store, count: int) -> list[str]:
    names = [f"user{i:05d}" for i in range(count)]
    pipe = store.client.pipeline(transaction=False)
    for name in names:
        pipe.hset(store.prefix + name, mapping={"password": "00", "ident": f"-{name}", "display_name": name.upper()})
    pipe.execute()
    return names


@pytest.fixture
def config_overrides(redis_users):
    return redis_overrides(redis_users)


async def test_every_hash_under_the_prefix_is_read_in_pipelines_of_a_batch(redis_users, backend, monkeypatch):
    redis_users.clear()
    names = fill(redis_users, MANY)
    sizes = count_pipelines(monkeypatch, backend)
    users = await backend.list_users()
    assert sorted(user.name for user in users) == names
    assert {(user.ident, user.display_name) for user in users} == {(f"-{name}", name.upper()) for name in names}
    whole, part = divmod(MANY, LIST_BATCH)
    assert sorted(sizes, reverse=True) == [LIST_BATCH] * whole + [part]


async def test_keys_of_other_types_under_the_prefix_are_no_users(redis_users, backend):
    redis_users.client.set(redis_users.prefix + "a-string", "x")
    redis_users.client.sadd(redis_users.prefix + "a-set", "x")
    assert sorted(user.name for user in await backend.list_users()) == ["alice", "bob"]


@pytest.fixture
def globbed(redis_url) -> Iterator[tuple[Store, Store]]:
    """A prefix with glob characters, and a store beside it whose keys the prefix's unescaped
    pattern would also match."""
    store, decoy = make_store(redis_url), make_store(redis_url)
    store.prefix += "a*[b]?\\:"
    decoy.prefix = store.prefix.replace("a*[b]?\\:", "aXXbY:")
    yield store, decoy
    for each in (store, decoy):
        each.clear()
        each.client.close()


class TestGlobPrefix:
    @pytest.fixture
    def config_overrides(self, globbed):
        return redis_overrides(globbed[0])

    async def test_the_prefix_is_matched_literally(self, globbed, backend):
        store, decoy = globbed
        store.put_record(record("ann"))
        decoy.put_record(record("mallory"))
        assert decoy.client.keys(store.prefix + "*")  # the unescaped pattern catches the decoy
        assert [user.name for user in await backend.list_users()] == ["ann"]


class TestLostPartWay:
    @pytest.fixture
    def private(self, redis_server) -> Iterator[Store]:
        store = make_store(redis_server.url)
        yield store
        store.client.close()

    @pytest.fixture
    def config_overrides(self, private):
        return redis_overrides(private, socket_timeout=0.5, connect_timeout=0.5, retries=0)

    async def test_redis_lost_after_a_batch_makes_the_listing_incomplete(
        self, redis_server, private, backend, monkeypatch
    ):
        fill(private, MANY)
        client = backend.client
        real_pipeline = client.pipeline

        def pipeline(*args, **kwargs):
            pipe = real_pipeline(*args, **kwargs)
            real_execute = pipe.execute

            async def execute(*a, **k):
                replies = await real_execute(*a, **k)
                redis_server.stop()  # after the first batch was read
                return replies

            pipe.execute = execute
            return pipe

        monkeypatch.setattr(client, "pipeline", pipeline)
        with pytest.raises(StoreIncomplete, match=f"failed after {LIST_BATCH} users were read") as raised:
            await backend.list_users()
        assert len(raised.value.users) == LIST_BATCH
        assert "\n" not in str(raised.value)


NAMES = [f"user{i}" for i in range(30)]


class TestCluster:
    @pytest.fixture
    def cluster_store(self, redis_cluster) -> Iterator[Store]:
        client = redis.cluster.RedisCluster(host="127.0.0.1", port=redis_cluster.nodes[0].port, socket_timeout=2)
        store = Store(redis_cluster.nodes[0].url, "test:cluster:", client)  # type: ignore[arg-type]
        for name in NAMES:
            store.put_record(record(name, ident=f"={name}", admin="true") if name == "user7" else record(name))
        yield store
        client.close()

    @pytest.fixture
    def config_overrides(self, redis_cluster, cluster_store):
        return {
            "backend": {"type": "redis"},
            "backend.redis": {
                "mode": "cluster",
                "url": redis_cluster.nodes[0].url,
                "cluster_nodes": redis_cluster.addresses[1:],
                "key_prefix": cluster_store.prefix,
            },
        }

    async def test_users_on_every_node_are_listed(self, cluster_store, backend):
        nodes = {cluster_store.client.keyslot(cluster_store.prefix + name) // 5462 for name in NAMES}
        assert nodes == {0, 1, 2}  # the names really spread over the three nodes
        users = {user.name: user for user in await backend.list_users()}
        assert sorted(users) == sorted(NAMES)
        assert users["user7"].admin and users["user7"].ident == "=user7"
        assert not users["user8"].admin
