"""The session store's contracts, one per interface (backends/sessions/__init__.py), each run
against SQLite and a real Redis: sessions and devices (SessionStore), delegation state
(DelegationState), shared rate buckets (RateBuckets)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
import typing
import uuid

import pytest

from backends.sessions import (
    BrowserSessions,
    DelegationState,
    FactorStore,
    ImportedState,
    LoginTokenStore,
    OAuthStore,
    RateBuckets,
    Session,
    SessionStore,
    create_session_store,
)
from backends.sessions.redis import RedisSessionStore
from backends.sessions.sqlite import SqliteSessionStore
from backends.sessions.sqlite.schema import VERSION, migrate
from homeserver.config import build_config
from homeserver.ratelimit import TokenBuckets


def session(token_hash: str, user: str = "alice", device: str = "D1", ts: int | None = None, **kw) -> Session:
    ts = ts or int(time.time() * 1000)
    return Session(token_hash, user, device, ts, "10.0.0.1", ts, **kw)


def store_options(kind: str, tmp_path, request) -> dict:
    if kind == "sqlite":
        return {"path": str(tmp_path / "s.db"), "timeout": 1.0, "keep_ended": 3600.0}
    url = request.getfixturevalue("redis_url")
    config = build_config({"sessions": {"redis": {"url": url, "key_prefix": f"test:{uuid.uuid4().hex}:"}}})
    return dict(config.section("sessions.redis"), keep_ended=3600.0)


@pytest.fixture(params=["sqlite", "redis"])
def each_session_store(request, tmp_path, io_loop):
    each_session_store = create_session_store(request.param, store_options(request.param, tmp_path, request), config_dir=str(tmp_path))
    io_loop.run_sync(each_session_store.start)
    yield each_session_store
    io_loop.run_sync(each_session_store.close)


# The store's other parts: its door (a method of SessionStore) -> the part's interface.
DOORS = {
    "oauth": OAuthStore,
    "browser_sessions": BrowserSessions,
    "buckets": RateBuckets,
    "delegation": DelegationState,
    "login_tokens": LoginTokenStore,
    "imported": ImportedState,
    "factors": FactorStore,
}


@pytest.fixture
def each_delegation_state(each_session_store) -> DelegationState:
    """The store's DelegationState (its door), as homeserver.delegation takes it."""
    return each_session_store.delegation()


@pytest.fixture
def each_rate_buckets(each_session_store) -> RateBuckets:
    """The store's RateBuckets (its door), as homeserver.ratelimit takes it."""
    return each_session_store.buckets()


@pytest.mark.parametrize("store_class", [SqliteSessionStore, RedisSessionStore])
def test_each_store_implements_every_interface_and_each_job_is_in_one(store_class):
    assert issubclass(store_class, SessionStore) and not store_class.__abstractmethods__
    for door, interface in DOORS.items():
        part = typing.get_type_hints(getattr(store_class, door))["return"]
        assert issubclass(part, interface) and not part.__abstractmethods__
        # The job is its part's alone: the store carries none of the part's own methods.
        own = interface.__abstractmethods__ - SessionStore.__abstractmethods__
        assert not [name for name in own if hasattr(store_class, name)], door


async def test_each_interface_of_one_store_is_the_same_object(each_session_store):
    for door, interface in DOORS.items():
        part = getattr(each_session_store, door)()
        assert isinstance(part, interface)
        assert getattr(each_session_store, door)() is part  # built once, with the store


async def test_two_servers_on_one_store_share_delegation_state_and_buckets(each_session_store, request, tmp_path):
    """What one worker or server marks, the others on the same store see."""
    kind = each_session_store.name
    options = store_options(kind, tmp_path, request)
    if kind == "redis":
        options["key_prefix"] = each_session_store.prefix
    other = create_session_store(kind, options, config_dir=str(tmp_path))
    await other.start()
    try:
        await each_session_store.delegation().mark_resync("alice", 7)
        assert await other.delegation().resyncs() == {"alice": 7}
        assert await each_session_store.buckets().rate_limit("address:x", 1.0, 1.0) == 0.0
        assert await other.buckets().rate_limit("address:x", 1.0, 1.0, take=False) > 0
        assert await other.buckets().rate_limit("address:x", 1.0, 1.0) > 0
    finally:
        await other.close()


async def test_open_get_end_keeps_a_tombstone(each_session_store):
    await each_session_store.open(session("h1"), "Phone")
    got = await each_session_store.get("alice", "h1")
    assert got is not None and got.ended_ts is None and got.device_id == "D1"
    assert await each_session_store.get("bob", "h1") is None  # another user's token digest is nobody's
    assert await each_session_store.get("alice", "nope") is None
    assert await each_session_store.end("alice", "h1") is True
    assert await each_session_store.end("alice", "h1") is False
    ended = await each_session_store.get("alice", "h1")
    assert ended is not None and ended.ended_ts is not None


async def test_devices_live_while_a_session_is_open(each_session_store):
    await each_session_store.open(session("a", device="D1", ts=1000), "First")
    await each_session_store.open(session("b", device="D1", ts=2000), "Ignored: the device exists")
    await each_session_store.open(session("c", device="D2", ts=3000), None)
    devices = {d.device_id: d for d in await each_session_store.devices("alice")}
    assert devices["D1"].display_name == "First" and devices["D2"].display_name == ""
    assert devices["D1"].last_seen_ts == 2000
    await each_session_store.touch("alice", "a", "10.9.9.9", 5000)
    d1 = await each_session_store.device("alice", "D1")
    assert (d1.last_seen_ip, d1.last_seen_ts) == ("10.9.9.9", 5000)
    assert await each_session_store.rename_device("alice", "D2", "Laptop") is True
    assert (await each_session_store.device("alice", "D2")).display_name == "Laptop"
    assert await each_session_store.rename_device("alice", "NOPE", "x") is False
    assert await each_session_store.end("alice", "a") and await each_session_store.device("alice", "D1") is not None
    assert await each_session_store.end("alice", "b") and await each_session_store.device("alice", "D1") is None
    assert [d.device_id for d in await each_session_store.devices("alice")] == ["D2"]
    assert await each_session_store.users() == ["alice"]
    assert await each_session_store.end_devices("alice", ["D2", "D2", "NEVER"]) == 1
    assert await each_session_store.devices("alice") == [] and await each_session_store.users() == []


async def test_end_all_of_one_user_only(each_session_store):
    for i, user in enumerate(["alice", "alice", "bob"]):
        await each_session_store.open(session(f"h{i}", user=user, device=f"D{i}"), None)
    assert await each_session_store.end_devices("alice", None) == 2
    assert [d.device_id for d in await each_session_store.devices("bob")] == ["D2"]
    assert (await each_session_store.get("alice", "h0")).ended_ts is not None


async def test_expired_sessions_are_gone(each_session_store):
    now = int(time.time() * 1000)
    await each_session_store.open(session("old", expires_ts=now - 1), None)
    await each_session_store.open(session("new", expires_ts=now + 60_000), None)
    assert await each_session_store.get("alice", "old") is None
    assert (await each_session_store.get("alice", "new")).expires_ts == now + 60_000


@pytest.mark.parametrize("rate, burst", [(1.0, 3), (0.17, 3), (10.0, 1)])
async def test_rate_limit_is_the_gcra_of_token_buckets(each_rate_buckets, rate, burst):
    buckets = each_rate_buckets
    local = TokenBuckets(rate, burst)
    interval, capacity = local.interval, local.capacity
    shared = [await buckets.rate_limit("k", interval, capacity) for _ in range(burst + 2)]
    expected = [local.take("k") for _ in range(burst + 2)]
    assert [w == 0.0 for w in shared] == [w == 0.0 for w in expected]
    assert shared[-1] == pytest.approx(expected[-1], abs=0.05)
    # Peeking takes nothing.
    peek = await buckets.rate_limit("k", interval, capacity, take=False)
    assert peek == pytest.approx(expected[-1], abs=0.05)
    assert await buckets.rate_limit("other", interval, capacity, take=False) == 0.0
    assert await buckets.rate_limit("other", interval, capacity, take=False) == 0.0  # still nothing taken


def test_migration_from_an_empty_and_an_older_file(tmp_path):
    path = tmp_path / "s.db"
    conn = sqlite3.connect(path, isolation_level=None)
    assert migrate(conn) == 0
    assert conn.execute("PRAGMA user_version").fetchone()[0] == VERSION
    assert migrate(conn) == VERSION  # nothing left to do
    conn.execute(f"PRAGMA user_version = {VERSION + 1}")
    with pytest.raises(sqlite3.DatabaseError, match="newer"):
        migrate(conn)
    conn.close()


async def test_delegation_provisioned_digest(each_delegation_state):
    assert await each_delegation_state.provisioned("alice") is None
    await each_delegation_state.set_provisioned("alice", "d1")
    await each_delegation_state.set_provisioned("alice", "d2")
    assert await each_delegation_state.provisioned("alice") == "d2"
    assert await each_delegation_state.provisioned("bob") is None


async def test_delegation_resync_is_cleared_only_if_not_marked_again(each_delegation_state):
    assert await each_delegation_state.resyncs() == {}
    await each_delegation_state.mark_resync("alice", 1)
    await each_delegation_state.mark_resync("bob", 5)
    await each_delegation_state.mark_resync("alice", 2)  # a second failure while the first is retried
    assert await each_delegation_state.resyncs() == {"alice": 2, "bob": 5}
    assert not await each_delegation_state.clear_resync("alice", 1)  # the retry read mark 1: alice stays
    assert await each_delegation_state.clear_resync("alice", 2)
    assert await each_delegation_state.clear_resync("bob", 5)
    assert await each_delegation_state.resyncs() == {}


# -- credential fingerprints (account state) ------------------------------------------------


async def test_fingerprints_are_kept_with_the_session(each_session_store):
    await each_session_store.open(session("f1", identity_fp="id-a", password_fp="pw-a"), None)
    await each_session_store.open(session("f0"), None)  # opened before fingerprints were kept
    got = await each_session_store.get("alice", "f1")
    assert (got.identity_fp, got.password_fp) == ("id-a", "pw-a")
    old = await each_session_store.get("alice", "f0")
    assert (old.identity_fp, old.password_fp) == (None, None)


async def test_end_stale_ends_only_sessions_of_other_credentials(each_session_store):
    store = each_session_store
    await store.open(session("s1", device="OLD", identity_fp="id-a", password_fp="pw-a"), None)
    await store.open(session("s2", device="OLD", identity_fp="id-a", password_fp="pw-a"), None)
    await store.open(session("s3", device="NEW", identity_fp="id-a", password_fp="pw-b"), None)
    await store.open(session("s4", device="LEGACY"), None)
    await store.open(session("s5", user="bob", device="OLD", identity_fp="id-x", password_fp="pw-x"), None)
    # The password changed to pw-b: s1 and s2 (one device) end, s3 (opened since) stays,
    # the session without fingerprints stays, another user's stays.
    ended = await store.end_stale("alice", ["id-a"], ["pw-b"])
    assert sorted(ended) == ["OLD", "OLD"]
    assert (await store.get("alice", "s1")).ended_ts is not None
    assert (await store.get("alice", "s2")).ended_ts is not None
    assert (await store.get("alice", "s3")).ended_ts is None
    assert (await store.get("alice", "s4")).ended_ts is None
    assert (await store.get("bob", "s5")).ended_ts is None
    assert [d.device_id for d in await store.devices("alice")] == ["LEGACY", "NEW"]
    assert await store.end_stale("alice", ["id-a"], ["pw-b"]) == []  # nothing left to end


async def test_end_stale_without_password_fingerprints_compares_identity_only(each_session_store):
    store = each_session_store
    await store.open(session("p1", device="D1", identity_fp="id-a", password_fp="pw-a"), None)
    await store.open(session("p2", device="D2", identity_fp="id-old", password_fp="pw-a"), None)
    assert await store.end_stale("alice", ["id-a"], None) == ["D2"]
    assert (await store.get("alice", "p1")).ended_ts is None
    # Any of several accepted digests (one per signing key) keeps a session.
    assert await store.end_stale("alice", ["id-new", "id-a"], ["pw-new", "pw-a"]) == []
    assert await store.end_stale("alice", ["id-new"], None) == ["D1"]
    assert await store.devices("alice") == []


def test_sqlite_migration_keeps_sessions_without_fingerprints(tmp_path):
    from backends.sessions.sqlite.schema import MIGRATIONS

    path = str(tmp_path / "old.db")
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in filter(str.strip, MIGRATIONS[0].split(";")):
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 1")
    conn.execute(
        "INSERT INTO sessions (token_hash, user, device_id, created_ts, last_seen_ip, last_seen_ts) "
        "VALUES ('h', 'alice', 'D', 1, '', 1)"
    )
    assert migrate(conn) == 1
    assert conn.execute("PRAGMA user_version").fetchone()[0] == VERSION >= 2
    assert conn.execute("SELECT identity_fp, password_fp FROM sessions").fetchall() == [(None, None)]
    conn.close()


def test_servers_starting_at_once_on_a_fresh_file_all_start(tmp_path):
    """Two servers started together on a fresh install both create the SQLite file and
    switch it to WAL; SQLite may answer one "database is locked" at once. Each still starts."""
    script = (
        "import asyncio, sys\n"
        "from backends.sessions.sqlite import SqliteSessionStore\n"
        "async def main():\n"
        "    for _ in range(2):  # as run.py: once in the parent (the probe), then to serve\n"
        "        store = SqliteSessionStore(sys.argv[1], timeout=5.0)\n"
        "        await store.start()\n"
        "        await store.close()\n"
        "asyncio.run(main())\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for attempt in range(12):
        path = str(tmp_path / f"sessions-{attempt}.db")
        procs = [
            subprocess.Popen([sys.executable, "-c", script, path], cwd=root, stderr=subprocess.PIPE, text=True)
            for _ in range(4)
        ]
        for proc in procs:
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err


# -- which sessions used a second factor (issue 38) ---------------------------------------------


async def test_a_session_keeps_its_second_factor_and_its_device_shows_the_latest_seen(each_session_store):
    store = each_session_store
    await store.open(session("m1", device="PHONE", ts=1000, second_factor="totp"), "Phone")
    await store.open(session("m0", device="OLD", ts=1000), None)  # a password login's: none
    assert (await store.get("alice", "m1")).second_factor == "totp"
    assert (await store.get("alice", "m0")).second_factor == ""
    devices = {d.device_id: d for d in await store.devices("alice")}
    assert (devices["PHONE"].second_factor, devices["OLD"].second_factor) == ("totp", "")
    # A later session of the device (a refresh's access token, a sign-in again) is what shows.
    await store.open(session("m2", device="PHONE", ts=2000, second_factor="webauthn"), None)
    assert (await store.device("alice", "PHONE")).second_factor == "webauthn"


def test_sqlite_adds_a_column_once_whatever_the_migration_number(tmp_path):
    """The lead renumbers parallel migrations at merges: a column a file has already is not
    added again (a guarded ALTER TABLE), so a file migrated under another numbering opens."""
    from backends.sessions.sqlite.schema import MIGRATIONS

    conn = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    assert migrate(conn) == 0
    # Wherever it stands (others may come after it), the migration adding second_factor again.
    index = next(i for i, script in enumerate(MIGRATIONS) if "ADD COLUMN second_factor" in script)
    conn.execute(f"PRAGMA user_version = {index}")
    assert migrate(conn) == index  # it and those after it again, on tables that have their columns
    columns = [row[1] for row in conn.execute("PRAGMA table_info(sessions)")]
    assert columns.count("second_factor") == 1
    conn.close()
