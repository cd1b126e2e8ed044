"""The OAuth tables in the SQLite session file's numbered migrations (5: clients, codes, grants,
refresh tokens; 6: device authorizations): a fresh file has them at start, and a file where
a server before them made the tables on first use (outside the migrations, at schema
version 4) is adopted with its rows."""

from __future__ import annotations

import json
import sqlite3
import time

from backends.sessions.oauth import PENDING, CodeRecord, Grant
from backends.sessions.sqlite import SqliteSessionStore
from backends.sessions.sqlite.schema import MIGRATIONS, VERSION

OAUTH_TABLES = {"oauth_clients", "oauth_codes", "oauth_grants", "oauth_refresh", "oauth_device_codes"}

# What the OAuth store ran on first use up to main fda8e5a (sqlite_oauth.SCHEMA and
# sqlite_oauth_device.DEVICE_SCHEMA), as it ran it: verbatim, beside a version-4 schema.
LAZY_OAUTH = """
CREATE TABLE IF NOT EXISTS oauth_clients (
    client_id  TEXT PRIMARY KEY,
    metadata   TEXT NOT NULL,     -- JSON, as registered
    expires_ts INTEGER NOT NULL   -- ms, kept past it while a grant of the client lives
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS oauth_codes (
    code_hash  TEXT PRIMARY KEY,  -- SHA-256 of the code, hex
    record     TEXT NOT NULL,
    uses       INTEGER NOT NULL DEFAULT 0,
    expires_ts INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS oauth_grants (
    grant_id   TEXT PRIMARY KEY,
    user       TEXT NOT NULL,
    device_id  TEXT NOT NULL,
    client_id  TEXT NOT NULL,
    record     TEXT NOT NULL,     -- the Grant, JSON
    expires_ts INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS oauth_grants_device ON oauth_grants (user, device_id);
CREATE INDEX IF NOT EXISTS oauth_grants_client ON oauth_grants (client_id);
CREATE TABLE IF NOT EXISTS oauth_refresh (
    refresh_hash TEXT PRIMARY KEY, -- SHA-256 of a refresh token, hex
    grant_id     TEXT NOT NULL,
    expires_ts   INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS oauth_refresh_grant ON oauth_refresh (grant_id);
"""
LAZY_DEVICE = """
CREATE TABLE IF NOT EXISTS oauth_device_codes (
    device_hash    TEXT PRIMARY KEY,  -- SHA-256 of the device code, hex
    user_code_hash TEXT NOT NULL UNIQUE,
    record         TEXT NOT NULL,     -- what the client asked, JSON
    state          TEXT NOT NULL,
    decision       TEXT NOT NULL DEFAULT '{}',
    last_poll_ts   INTEGER NOT NULL DEFAULT 0,
    expires_ts     INTEGER NOT NULL   -- ms: the row goes after it
) WITHOUT ROWID
"""

GRANT = Grant("g1", "alice", "D1", "c1", "openid", "r1", "", "a1", 1, 1)
CODE = CodeRecord("c1", "Old", "http://127.0.0.1/cb", "x" * 43, "alice", "D1", "openid", "i", "p", 1)


def old_file(path: str, *, device_table: bool) -> None:
    """A session file as main's server left it: the four migrations (user_version 4), the
    OAuth tables made on first use, a client, a code and a grant in them; the device table
    too when a device authorization was ever asked for."""
    conn = sqlite3.connect(path, isolation_level=None)
    for script in MIGRATIONS[:4]:
        for statement in filter(str.strip, script.split(";")):
            conn.execute(statement)
    conn.execute("PRAGMA user_version = 4")
    for statement in filter(str.strip, LAZY_OAUTH.split(";")):
        conn.execute(statement)
    later = int(time.time() * 1000) + 3_600_000
    conn.execute("INSERT INTO oauth_clients VALUES ('c1', ?, ?)", (json.dumps({"client_name": "Old"}), later))
    conn.execute("INSERT INTO oauth_codes (code_hash, record, expires_ts) VALUES ('h1', ?, ?)", (CODE.encode(), later))
    conn.execute("INSERT INTO oauth_grants VALUES ('g1', 'alice', 'D1', 'c1', ?, ?)", (GRANT.encode(), later))
    conn.execute("INSERT INTO oauth_refresh VALUES ('r1', 'g1', ?)", (later,))
    if device_table:
        conn.execute(LAZY_DEVICE)
        conn.execute(
            "INSERT INTO oauth_device_codes (device_hash, user_code_hash, record, state, expires_ts) "
            "VALUES ('dev1', 'user1', '{\"client_id\": \"c1\"}', ?, ?)",
            (PENDING, later),
        )
    conn.close()


def schema_of(path: str) -> tuple[int, set[str]]:
    conn = sqlite3.connect(path)
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        conn.close()
    return version, tables


async def test_a_fresh_file_has_the_oauth_tables_at_start(tmp_path):
    path = str(tmp_path / "s.db")
    store = SqliteSessionStore(path, timeout=1.0)
    await store.start()
    try:
        version, tables = schema_of(path)
        assert version == VERSION and OAUTH_TABLES <= tables
        # The first OAuth read is on the loop's read connection: the tables are there already.
        assert await store.oauth().grant_by_refresh("r1") is None
        assert await store.oauth().device_code_by_user_code("user1") is None
    finally:
        await store.close()


async def test_a_file_whose_oauth_tables_were_made_on_first_use_is_adopted(tmp_path):
    for device_table in (True, False):
        path = str(tmp_path / f"old-{device_table}.db")
        old_file(path, device_table=device_table)
        store = SqliteSessionStore(path, timeout=1.0)
        await store.start()
        try:
            version, tables = schema_of(path)
            assert version == VERSION and OAUTH_TABLES <= tables
            oauth = store.oauth()
            assert await oauth.client("c1") == {"client_name": "Old"}
            assert await oauth.grant_by_refresh("r1") == GRANT
            assert await oauth.take_code("h1") == (CODE, 1)
            found = await oauth.device_code_by_user_code("user1")
            assert (found is not None) is device_table
            if found is not None:
                assert (found.device_hash, found.state) == ("dev1", PENDING)
            # And the store goes on writing them as before.
            assert await oauth.rotate_grant("r1", Grant("g1", "alice", "D1", "c1", "openid", "r2", "r1", "a2", 2, 1), 60)
            assert (await oauth.grant_by_refresh("r2")).previous_hash == "r1"
            assert await oauth.add_device_code("dev2", "user2", {"client_id": "c1"}, 60)
        finally:
            await store.close()


async def test_a_fresh_file_has_the_login_tokens_table(tmp_path):
    """The login tokens (MSC3824) are born in a numbered migration of their own."""
    path = str(tmp_path / "s.db")
    store = SqliteSessionStore(path, timeout=1.0)
    await store.start()
    try:
        version, tables = schema_of(path)
        assert version == VERSION and "login_tokens" in tables
        assert len([script for script in MIGRATIONS if "CREATE TABLE IF NOT EXISTS login_tokens" in script]) == 1
    finally:
        await store.close()
