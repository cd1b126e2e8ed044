"""The second factors' store (backends/sessions/factors.py) on SQLite and on a real Redis: the
stage-1 contract (tests/mfa/store_contract.py) through each store's door `factors()`, what two
servers on one store share, and the SQLite file's migration."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from dataclasses import replace

import pytest

from backends.sessions import FactorStore, create_session_store
from backends.sessions.factors import Challenge
from backends.sessions.sqlite.schema import MIGRATIONS, VERSION, migrate
from tests.backends.test_session_store import store_options
from tests.mfa.store_contract import FactorStoreContract, app, codes, key


@pytest.fixture(params=["sqlite", "redis"])
def session_store(request, tmp_path, io_loop):
    store = create_session_store(request.param, store_options(request.param, tmp_path, request), config_dir=str(tmp_path))
    io_loop.run_sync(store.start)
    yield store
    io_loop.run_sync(store.close)


class TestFactorStores(FactorStoreContract):
    @pytest.fixture
    def factor_store(self, session_store) -> FactorStore:
        return session_store.factors()


async def test_the_door_gives_one_part(session_store):
    assert isinstance(session_store.factors(), FactorStore)
    assert session_store.factors() is session_store.factors()


async def test_two_servers_on_one_store_see_one_set_of_factors(session_store, request, tmp_path):
    """What one process adds or uses, another on the same file or Redis sees: a code used on
    one is used on all."""
    options = store_options(session_store.name, tmp_path, request)
    if session_store.name == "redis":
        options["key_prefix"] = session_store.prefix
    other = create_session_store(session_store.name, options, config_dir=str(tmp_path))
    await other.start()
    try:
        mine, theirs = session_store.factors(), other.factors()
        for factor in (app(), key(), codes()):
            assert await mine.add_factor(factor)
        assert [f.factor_id for f in await theirs.factors("alice")] == ["t1", "p1", "r1"]
        results = await asyncio.gather(
            mine.accept_totp_step("alice", "t1", 9, 1), theirs.accept_totp_step("alice", "t1", 9, 2)
        )
        assert sorted(results) == [False, True]
        assert await theirs.use_recovery_code("alice", "h1", 3)
        assert not await mine.use_recovery_code("alice", "h1", 4)
        challenge = Challenge("alice", "authenticate", b"c" * 32, int(time.time() * 1000) + 60_000)
        await mine.add_challenge(challenge)
        assert await theirs.take_challenge(challenge.key) == challenge
        assert await mine.take_challenge(challenge.key) is None
    finally:
        await other.close()


async def test_names_and_every_field_survive_each_store(session_store):
    """A person's label in any script, and the bytes of a secret and a key, come back as given
    (Redis's scripts decode and encode the records)."""
    store = session_store.factors()
    named = replace(app(factor_id="t9", last_step=5), name="Téléphone 📱 \"x\"")
    assert await store.add_factor(named)
    assert await store.accept_totp_step("alice", "t9", 6, 1_700_000_000_123)
    (found,) = await store.factors("alice")
    assert found.name == named.name and found.sealed_secret == named.sealed_secret
    assert (found.last_step, found.last_used_ts) == (6, 1_700_000_000_123)
    await store.set_recovery_codes(codes(hashes=("only",)))
    assert await store.use_recovery_code("alice", "only", 1)
    (_, left) = await store.factors("alice")
    assert left.code_hashes == ()


def test_a_fresh_file_has_the_factor_tables_and_an_older_one_gets_them(tmp_path):
    conn = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    for script in MIGRATIONS[: VERSION - 1]:
        for statement in filter(str.strip, script.split(";")):
            conn.execute(statement)
    conn.execute(f"PRAGMA user_version = {VERSION - 1}")
    assert migrate(conn) == VERSION - 1
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"mfa_factors", "mfa_challenges"} <= tables
    conn.close()
