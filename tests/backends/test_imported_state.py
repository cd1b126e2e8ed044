"""The contract of `ImportedState` (backends/sessions/imported.py, a Synapse moved here), against
SQLite and a real Redis: a batch's sessions, devices and grants are the stores' own records, its
bookkeeping answers the auth step and a second run, `undo` takes a batch back."""

from __future__ import annotations

import time

import pytest

from backends.sessions.imported import ImportBatch
from backends.sessions.oauth import Grant
from homeserver.oauth.common import grant_session_digest
from tests.backends.test_add_users import flush_scripts_before_each_transaction
from tests.backends.test_session_store import each_session_store, session
from tests.support.redis_servers import redis_cluster, redis_server

__all__ = ["each_session_store", "redis_cluster", "redis_server"]

IDLE = 3600.0


def grant(user: str, device: str, refresh: str, previous: str = "", access: str = "a0") -> Grant:
    now = int(time.time() * 1000)
    return Grant(f"synapse-{user}-{device}", user, device, "legacy", "", refresh, previous, access, now, now)


def batch() -> ImportBatch:
    return ImportBatch(
        sessions=[(session("t1", "alice", "PHONE"), "Alice's phone"), (session("t2", "alice", "LAPTOP"), "Laptop"),
                  (session(grant_session_digest("synapse-alice-LAPTOP"), "alice", "LAPTOP"), "Laptop"),
                  (session("t3", "bob", "DESK"), None)],
        grants=[(grant("alice", "LAPTOP", "r2", "r1", "t2"), IDLE)],
        tokens=[("t1", "alice"), ("t2", "alice"), ("r1", "alice"), ("r2", "alice"), ("t3", "bob")],
        deactivated=["carol"],
    )


async def test_a_batch_is_the_stores_own_sessions_devices_and_grants(each_session_store):
    store = each_session_store
    part = store.imported()
    await part.add(batch())
    assert (await store.get("alice", "t1")).device_id == "PHONE"
    assert {(d.device_id, d.display_name) for d in await store.devices("alice")} == {
        ("PHONE", "Alice's phone"), ("LAPTOP", "Laptop")}
    assert [d.display_name for d in await store.devices("bob")] == [""]
    oauth = store.oauth()
    for refresh in ("r2", "r1"):  # current and previous both lead to the grant
        found = await oauth.grant_by_refresh(refresh)
        assert found is not None and (found.device_id, found.previous_hash) == ("LAPTOP", "r1")
    assert (await oauth.device_grant("alice", "LAPTOP")).refresh_hash == "r2"
    assert set(await store.users()) >= {"alice", "bob"}


async def test_the_bookkeeping_answers_a_second_run_and_the_auth_step(each_session_store):
    part = each_session_store.imported()
    assert await part.known_tokens(["t1", "r2"]) == set()
    await part.add(batch())
    assert await part.known_tokens(["t1", "r2", "zz", "t3"]) == {"t1", "r2", "t3"}
    assert await part.known_tokens([]) == set()
    assert (await part.token_user("t3"), await part.token_user("zz")) == ("bob", None)
    assert await part.is_deactivated("carol") and not await part.is_deactivated("alice")
    assert await part.deactivated_users() == {"carol"}


async def test_a_batch_written_again_changes_nothing(each_session_store):
    store = each_session_store
    await store.imported().add(batch())
    await store.end("alice", "t1")
    again = batch()
    await store.imported().add(again)
    assert (await store.get("alice", "t1")).ended_ts is not None
    assert {d.device_id for d in await store.devices("alice")} >= {"LAPTOP"}
    assert await store.imported().known_tokens(["t1"]) == {"t1"}


async def test_undo_takes_a_batch_back_but_keeps_the_deactivated(each_session_store):
    store = each_session_store
    part = store.imported()
    await store.open(session("own", "alice", "PHONE"), "mine")
    await part.add(batch())
    await part.undo(batch())
    assert await store.get("alice", "t1") is None and await store.get("bob", "t3") is None
    assert [d.device_id for d in await store.devices("alice")] == ["PHONE"]  # kept by a session of its own
    assert await store.devices("bob") == []
    assert await store.oauth().grant_by_refresh("r2") is None
    assert await store.oauth().device_grant("alice", "LAPTOP") is None
    assert await part.known_tokens(["t1", "r2"]) == set()
    assert await part.is_deactivated("carol")


@pytest.mark.parametrize("kind", ["sqlite"])
def test_the_tables_come_in_a_numbered_migration(kind, tmp_path):
    import sqlite3

    from backends.sessions.sqlite.schema import MIGRATIONS, migrate

    conn = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    migrate(conn)
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"synapse_tokens", "synapse_deactivated"} <= tables
    assert any("synapse_tokens" in script for script in MIGRATIONS)


async def test_a_batch_on_a_redis_cluster(redis_cluster, tmp_path):
    """A Cluster spreads a batch's keys over its nodes: one pipeline, the bookkeeping after it."""
    from backends.sessions import create_session_store
    from homeserver.config import build_config

    config = build_config({"sessions": {"store": "redis", "redis": {
        "url": f"redis://{redis_cluster.addresses[0]}/0", "mode": "cluster", "cluster_nodes": redis_cluster.addresses,
        "key_prefix": "test:imported:"}}})
    store = create_session_store("redis", dict(config.section("sessions.redis")), config_dir=str(tmp_path))
    await store.start()
    try:
        await store.imported().add(batch())
        assert (await store.get("bob", "t3")).device_id == "DESK"
        assert (await store.oauth().grant_by_refresh("r1")).refresh_hash == "r2"
        assert await store.imported().known_tokens(["t1", "t3", "nope"]) == {"t1", "t3"}
        assert await store.imported().deactivated_users() == {"carol"}
        await store.imported().undo(batch())
        assert await store.get("bob", "t3") is None
    finally:
        await store.close()


async def test_a_whole_batch_on_a_redis_cluster(redis_cluster, tmp_path):
    """A batch of the move (about 5,000 sessions) is more than a Cluster node's connections
    (`max_connections`, 100 by default): its scripts must not all be in flight at once."""
    from backends.sessions import create_session_store
    from homeserver.config import build_config

    config = build_config({"sessions": {"store": "redis", "redis": {
        "url": f"redis://{redis_cluster.addresses[0]}/0", "mode": "cluster", "cluster_nodes": redis_cluster.addresses,
        "key_prefix": "test:imported-many:"}}})
    store = create_session_store("redis", dict(config.section("sessions.redis")), config_dir=str(tmp_path))
    await store.start()
    try:
        sessions = [(session(f"t{i}", f"user{i % 300}", f"D{i}"), None) for i in range(1000)]
        await store.imported().add(ImportBatch(sessions=sessions, tokens=[(s.token_hash, s.user) for s, _ in sessions]))
        assert (await store.get("user99", "t999")).device_id == "D999"
        assert len(await store.imported().known_tokens([s.token_hash for s, _ in sessions])) == 1000
    finally:
        await store.close()


async def test_a_batch_on_a_redis_whose_script_cache_is_emptied_before_the_transaction(redis_server, tmp_path,
                                                                                     monkeypatch):
    """A failover to a fresh master between the OPEN script's load and the batch's MULTI/EXEC (or a
    SCRIPT FLUSH) loses no session of the batch, and marks none imported that was not written."""
    from backends.sessions import create_session_store
    from homeserver.config import build_config

    config = build_config({"sessions": {"store": "redis", "redis": {"url": redis_server.url,
                                                                   "key_prefix": "test:imported:"}}})
    store = create_session_store("redis", dict(config.section("sessions.redis")), config_dir=str(tmp_path))
    await store.start()
    try:
        part = store.imported()
        flush_scripts_before_each_transaction(part.connection.connect(), redis_server, monkeypatch)
        await part.add(batch())
        assert (await store.get("alice", "t1")).device_id == "PHONE"
        assert (await store.get("bob", "t3")).device_id == "DESK"
        assert (await store.oauth().grant_by_refresh("r1")).refresh_hash == "r2"
        assert await part.known_tokens(["t1", "t3", "nope"]) == {"t1", "t3"}
    finally:
        await store.close()
