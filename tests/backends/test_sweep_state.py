"""The directory sweep's state in the session store's delegation state (DelegationState), run
against SQLite and a real Redis: every digest at once, the users missing from the user store
and since when, the sweep's lease (one process sweeps, once per interval), and the count the
guard compares with."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from backends.sessions import create_session_store
from backends.sessions.delegation import DEACTIVATED, DelegationState
from backends.sessions.sqlite.schema import VERSION
from tests.backends.test_session_store import each_session_store, store_options  # noqa: F401  (fixture)


@pytest.fixture
def state(each_session_store) -> DelegationState:  # noqa: F811
    """The store's DelegationState (its door), as the sweep takes it."""
    return each_session_store.delegation()


async def test_every_digest_at_once(state):
    assert await state.provisioned_all() == {}
    for user, digest in (("alice", "a1"), ("bob", "b1"), ("carol", DEACTIVATED), ("alice", "a2")):
        await state.set_provisioned(user, digest)
    assert await state.provisioned_all() == {"alice": "a2", "bob": "b1", "carol": DEACTIVATED}
    assert await state.provisioned("carol") == DEACTIVATED


async def test_missing_users_keep_the_time_they_were_first_missed(state):
    assert await state.missing() == {}
    await state.set_missing({"alice": 1000, "bob": 2000})
    await state.set_missing({"alice": 5000, "carol": 3000})  # alice was missed before: 1000 stays
    assert await state.missing() == {"alice": 1000, "bob": 2000, "carol": 3000}
    await state.clear_missing(["alice", "nobody"])
    await state.clear_missing([])
    assert await state.missing() == {"bob": 2000, "carol": 3000}


async def test_the_lease_is_one_holders_and_a_sweep_is_due_once_per_interval(state):
    assert await state.claim_sweep("one", ttl_ms=60_000, interval_ms=60_000)
    # Held: nobody else, whether due or forced.
    assert not await state.claim_sweep("two", ttl_ms=60_000, interval_ms=None)
    assert await state.renew_sweep("one", ttl_ms=60_000)
    assert not await state.renew_sweep("two", ttl_ms=60_000)
    await state.release_sweep("two")  # not the holder: nothing
    assert not await state.claim_sweep("two", ttl_ms=60_000, interval_ms=None)
    await state.release_sweep("one")
    # Free, but a sweep started less than an interval ago: not due for anyone; forced, yes.
    assert not await state.claim_sweep("two", ttl_ms=60_000, interval_ms=60_000)
    assert not await state.claim_sweep("one", ttl_ms=60_000, interval_ms=60_000)
    assert await state.claim_sweep("two", ttl_ms=60_000, interval_ms=None)
    await state.release_sweep("two")
    await asyncio.sleep(0.06)
    assert await state.claim_sweep("one", ttl_ms=60_000, interval_ms=50)  # due again after the interval
    assert not await state.renew_sweep("two", ttl_ms=60_000)


async def test_a_lease_its_holder_stopped_renewing_runs_out(state):
    assert await state.claim_sweep("dead", ttl_ms=50, interval_ms=None)
    assert not await state.claim_sweep("alive", ttl_ms=60_000, interval_ms=None)
    await asyncio.sleep(0.08)
    assert await state.claim_sweep("alive", ttl_ms=60_000, interval_ms=None)
    assert not await state.renew_sweep("dead", ttl_ms=60_000)  # it lost the lease


async def test_processes_racing_for_a_due_sweep_let_one_in(each_session_store, request, tmp_path):  # noqa: F811
    stores = [each_session_store]
    for _ in range(3):  # other servers on the same file or Redis
        other = create_session_store(each_session_store.name, each_options(each_session_store, request, tmp_path),
                                     config_dir=str(tmp_path))
        await other.start()
        stores.append(other)
    try:
        won = await asyncio.gather(*(s.delegation().claim_sweep(f"p{i}", ttl_ms=60_000, interval_ms=60_000)
                                     for i, s in enumerate(stores)))
        assert sorted(won) == [False, False, False, True]
    finally:
        for other in stores[1:]:
            await other.close()


def each_options(store, request, tmp_path) -> dict:
    """The options of the store the fixture made (the same file, the same Redis prefix)."""
    options = store_options(store.name, tmp_path, request)
    if store.name == "redis":
        options["key_prefix"] = store.prefix
    return options


async def test_the_guards_reference_count(state):
    assert await state.sweep_reference() is None
    await state.set_sweep_reference(10_000)
    await state.set_sweep_reference(9_000)
    assert await state.sweep_reference() == 9_000
    # The lease's own fields leave it alone.
    assert await state.claim_sweep("one", ttl_ms=1000, interval_ms=None)
    await state.release_sweep("one")
    assert await state.sweep_reference() == 9_000


async def test_the_sweep_tables_come_in_a_migration(tmp_path):
    path = tmp_path / "s.db"
    store = create_session_store("sqlite", {"path": str(path), "timeout": 1.0, "keep_ended": 60.0},
                                 config_dir=str(tmp_path))
    await store.start()
    await store.close()
    conn = sqlite3.connect(path)
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"delegation_missing", "delegation_sweep"} <= tables
    assert conn.execute("PRAGMA user_version").fetchone()[0] == VERSION
    conn.close()
