"""The login tokens' contract (backends.sessions.login_tokens), the same on SQLite and on a real
Redis: a token is taken once, by one of several takers at once; never after its expiry; seen
by every server on the store; kept as its digest only."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import time

import pytest

from backends.sessions import LoginTokenRecord, create_session_store
from tests.backends.test_session_store import store_options


@pytest.fixture(params=["sqlite", "redis"])
def store(request, tmp_path, io_loop):
    store = create_session_store(request.param, store_options(request.param, tmp_path, request), config_dir=str(tmp_path))
    io_loop.run_sync(store.start)
    yield store
    io_loop.run_sync(store.close)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def made(user: str = "alice", lifetime: int = 120, **kw) -> LoginTokenRecord:
    now = int(time.time())
    fields = {"identity_fp": "id-fp", "password_fp": "pw-fp", "browser_session": "nonce1", **kw}
    return LoginTokenRecord(user, created=now, expires=now + lifetime, **fields)


async def test_a_token_is_taken_once_with_every_field(store):
    tokens = store.login_tokens()
    record = made(second_factor="totp")
    await tokens.add(digest("t1"), record)
    await tokens.add(digest("t2"), made("bob"))
    assert await tokens.take(digest("t1")) == record
    assert await tokens.take(digest("t1")) is None  # once
    assert await tokens.take(digest("unknown")) is None
    assert (await tokens.take(digest("t2"))).user == "bob"


async def test_an_expired_token_is_never_taken(store):
    tokens = store.login_tokens()
    await tokens.add(digest("gone"), made(lifetime=-1))
    await tokens.add(digest("soon"), made(lifetime=1))
    assert await tokens.take(digest("gone")) is None
    await asyncio.sleep(2.1)
    assert await tokens.take(digest("soon")) is None


async def test_a_token_kept_already_is_not_replaced(store):
    tokens = store.login_tokens()
    first = made("alice")
    await tokens.add(digest("same"), first)
    await tokens.add(digest("same"), made("mallory"))
    assert await tokens.take(digest("same")) == first


async def test_of_many_takers_at_once_one_gets_the_token(store):
    tokens = store.login_tokens()
    await tokens.add(digest("race"), made())
    taken = await asyncio.gather(*(tokens.take(digest("race")) for _ in range(8)))
    assert sum(record is not None for record in taken) == 1


async def test_another_server_on_the_store_takes_what_one_made(store, request, tmp_path):
    kind = store.name
    options = store_options(kind, tmp_path, request)
    if kind == "redis":
        options["key_prefix"] = store.prefix
    other = create_session_store(kind, options, config_dir=str(tmp_path))
    await other.start()
    try:
        await store.login_tokens().add(digest("shared"), made())
        assert (await other.login_tokens().take(digest("shared"))).user == "alice"
        assert await store.login_tokens().take(digest("shared")) is None
    finally:
        await other.close()


async def test_the_store_keeps_the_digest_only_and_forgets_expired_tokens(store, tmp_path):
    await store.login_tokens().add(digest("secret-token"), made(lifetime=60))
    if store.name == "redis":
        client = store.connection.connect()
        keys = [key.decode() for key in await client.keys(store.prefix + "*")]
        assert keys == [f"{store.prefix}lt:{digest('secret-token')}"]
        assert 55 <= await client.ttl(keys[0]) <= 60  # gone with the token
        assert b"secret-token" not in await client.get(keys[0])
        return
    await store.login_tokens().add(digest("old"), made(lifetime=-5))
    store.db._last_purge = None  # the next write purges
    await store.login_tokens().add(digest("new"), made())
    with sqlite3.connect(tmp_path / "s.db") as conn:
        rows = conn.execute("SELECT token_hash, record FROM login_tokens").fetchall()
    assert {row[0] for row in rows} == {digest("secret-token"), digest("new")}
    assert not any("secret-token" in row[0] + row[1] for row in rows)


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
async def test_a_process_purges_at_its_first_write_however_long_the_machine_has_been_up(store, tmp_path, monkeypatch):
    """Monotonic time starts near 0 at boot: a server started in a machine's first ten minutes
    (PURGE_EVERY) purged nothing until then. Its first write that adds rows purges now."""
    from backends.sessions.sqlite import file

    await store.login_tokens().add(digest("old"), made(lifetime=-5))
    store.db._last_purge = None  # as a process that has not purged yet
    monkeypatch.setattr(file.time, "monotonic", lambda: 5.0)  # the machine booted 5 s ago
    await store.login_tokens().add(digest("new"), made())
    with sqlite3.connect(tmp_path / "s.db") as conn:
        rows = conn.execute("SELECT token_hash FROM login_tokens").fetchall()
    assert {row[0] for row in rows} == {digest("new")}
