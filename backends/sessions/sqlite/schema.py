"""The SQLite session store's file: opening it (WAL, retried while another process holds it) and its
schema, created or migrated at start-up (PRAGMA user_version). Every table of every part is
born in a numbered migration: 1 sessions, devices, rate_limits; 2 delegation_users,
delegation_resync; 3 the sessions' credential fingerprints; 4 page_sessions (the account
page's sign-ins); 5 oauth_clients, oauth_codes, oauth_grants, oauth_refresh; 6
oauth_device_codes; 7 login_tokens (legacy clients' browser sign-ins, MSC3824); 8 synapse_tokens,
synapse_deactivated (a Synapse moved here); 9 mfa_factors, mfa_challenges and the second_factor
columns of sessions and page_sessions (second factors, issue 38); 10 delegation_missing,
delegation_sweep (the directory sweep)."""

from __future__ import annotations

import os
import re
import sqlite3
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# Each entry takes the schema from version i to i + 1 (the first makes version 1); append, never
# edit a released one. Every table of every part of the store is born here.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE sessions (
        token_hash   TEXT PRIMARY KEY,  -- SHA-256 of the token, hex, never the token itself
        user         TEXT NOT NULL,
        device_id    TEXT NOT NULL,
        created_ts   INTEGER NOT NULL,  -- ms since the epoch
        last_seen_ip TEXT NOT NULL,
        last_seen_ts INTEGER NOT NULL,
        expires_ts   INTEGER,           -- NULL: tokens without a lifetime
        ended_ts     INTEGER            -- set by logout / device deletion: a tombstone
    ) WITHOUT ROWID;
    CREATE INDEX sessions_open_by_device ON sessions (user, device_id) WHERE ended_ts IS NULL;
    CREATE INDEX sessions_ended ON sessions (ended_ts) WHERE ended_ts IS NOT NULL;
    CREATE TABLE devices (
        user         TEXT NOT NULL,
        device_id    TEXT NOT NULL,
        display_name TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (user, device_id)
    ) WITHOUT ROWID;
    CREATE TABLE rate_limits (
        key     TEXT PRIMARY KEY,
        full_at REAL NOT NULL           -- when the bucket is full again (GCRA), Unix seconds
    ) WITHOUT ROWID;
    """,
    # Delegation: the profile digest last provisioned at Synapse per user, and the users
    # whose devices Synapse must be told again (a call failed while it was away).
    """
    CREATE TABLE delegation_users (
        user   TEXT PRIMARY KEY,
        digest TEXT NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE delegation_resync (
        user TEXT PRIMARY KEY,
        mark INTEGER NOT NULL
    ) WITHOUT ROWID;
    """,
    # Account state: keyed digests of the identity and the password a session was opened
    # with, so a replaced account or a changed password ends it (NULL: opened before).
    """
    ALTER TABLE sessions ADD COLUMN identity_fp TEXT;
    ALTER TABLE sessions ADD COLUMN password_fp TEXT;
    """,
    # The account page's sign-ins (backends.sessions.sqlite.browser): one row each until it ends.
    """
    CREATE TABLE page_sessions (
        id         TEXT PRIMARY KEY,  -- the page cookie's nonce
        user       TEXT NOT NULL,
        created    INTEGER NOT NULL,  -- seconds since the epoch
        expires    INTEGER NOT NULL,  -- seconds since the epoch
        ip         TEXT NOT NULL,
        user_agent TEXT NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX page_sessions_by_user ON page_sessions (user);
    CREATE INDEX page_sessions_by_expiry ON page_sessions (expires);
    """,
    # 5: the OAuth 2.0 API's clients, authorization codes, grants and refresh tokens
    # (sqlite/oauth.py). IF NOT EXISTS: servers before this migration made these tables on
    # first use, outside the migrations; a file they made keeps its tables and rows.
    """
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
    """,
    # 6: the OAuth device authorizations (RFC 8628, sqlite/oauth_device.py); IF NOT EXISTS
    # as 5 (made on the first device authorization before).
    """
    CREATE TABLE IF NOT EXISTS oauth_device_codes (
        device_hash    TEXT PRIMARY KEY,  -- SHA-256 of the device code, hex
        user_code_hash TEXT NOT NULL UNIQUE,
        record         TEXT NOT NULL,     -- what the client asked, JSON
        state          TEXT NOT NULL,
        decision       TEXT NOT NULL DEFAULT '{}',
        last_poll_ts   INTEGER NOT NULL DEFAULT 0,
        expires_ts     INTEGER NOT NULL   -- ms: the row goes after it
    ) WITHOUT ROWID;
    """,
    # 7: the login tokens a legacy client's browser sign-in hands back (MSC3824,
    # sqlite/login_tokens.py): one row each until it is taken or expires. IF NOT EXISTS:
    # migrations of other parts may land beside it and be renumbered.
    """
    CREATE TABLE IF NOT EXISTS login_tokens (
        token_hash TEXT PRIMARY KEY,  -- SHA-256 of the token, hex, never the token itself
        record     TEXT NOT NULL,     -- the LoginTokenRecord, JSON
        expires    INTEGER NOT NULL   -- seconds since the epoch
    ) WITHOUT ROWID;
    CREATE INDEX IF NOT EXISTS login_tokens_by_expiry ON login_tokens (expires);
    """,
    # 8: a Synapse moved here (sqlite/imported.py): the tokens it carried (the move's bookkeeping,
    # and the user of a token that does not name its own) and the users Synapse had deactivated.
    """
    CREATE TABLE IF NOT EXISTS synapse_tokens (
        token_hash TEXT PRIMARY KEY,  -- SHA-256 of an access or refresh token carried, hex
        user       TEXT NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS synapse_deactivated (
        user TEXT PRIMARY KEY,
        ts   INTEGER NOT NULL         -- ms: when the move recorded it
    ) WITHOUT ROWID;
    """,
    # 9: second factors (sqlite/factors.py): each person's authenticator apps, passkeys and
    # recovery codes (the Factor as JSON; rowid keeps them oldest first), and the WebAuthn
    # challenges until they expire; which second factor each session and each browser session
    # passed ('' for none). IF NOT EXISTS and guarded ALTERs: migrations are renumbered at merges.
    """
    CREATE TABLE IF NOT EXISTS mfa_factors (
        factor_id     TEXT NOT NULL UNIQUE,
        user          TEXT NOT NULL,
        kind          TEXT NOT NULL,     -- totp, webauthn, recovery
        credential_id BLOB,              -- a passkey's (once per person), NULL for the others
        record        TEXT NOT NULL      -- the Factor, JSON (secrets sealed, codes as digests)
    );
    CREATE INDEX IF NOT EXISTS mfa_factors_by_user ON mfa_factors (user, kind);
    CREATE UNIQUE INDEX IF NOT EXISTS mfa_factors_credential ON mfa_factors (user, credential_id)
        WHERE credential_id IS NOT NULL;
    CREATE TABLE IF NOT EXISTS mfa_challenges (
        key        TEXT PRIMARY KEY,     -- SHA-256 of the challenge, hex
        record     TEXT NOT NULL,
        expires_ts INTEGER NOT NULL      -- ms
    ) WITHOUT ROWID;
    ALTER TABLE sessions ADD COLUMN second_factor TEXT NOT NULL DEFAULT '';
    ALTER TABLE page_sessions ADD COLUMN second_factor TEXT NOT NULL DEFAULT '';
    """,
    # 10: the directory sweep (issue 36, sqlite/delegation.py): the users provisioned at
    # Synapse it found missing from the user store and since when, and one row for the sweep
    # itself: its lease (who sweeps, until when), when the last sweep started, and how many
    # users the last sweep the guard let through found.
    """
    CREATE TABLE IF NOT EXISTS delegation_missing (
        user  TEXT PRIMARY KEY,
        since INTEGER NOT NULL            -- ms: the first sweep that missed them
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS delegation_sweep (
        id         INTEGER PRIMARY KEY CHECK (id = 1),
        holder     TEXT NOT NULL DEFAULT '', -- the process sweeping ('' for none)
        until_ms   INTEGER NOT NULL DEFAULT 0, -- its lease runs until then
        started_ms INTEGER NOT NULL DEFAULT 0, -- when the last sweep started
        reference  INTEGER                -- users the last unguarded sweep found
    );
    """,
]
VERSION = len(MIGRATIONS)


_ADD_COLUMN = re.compile(r"\s*ALTER\s+TABLE\s+(\w+)\s+ADD\s+COLUMN\s+(\w+)", re.IGNORECASE)


def _column_exists(conn: sqlite3.Connection, statement: str) -> bool:
    """Whether `statement` adds a column its table has already: the guard of every ALTER TABLE
    ... ADD COLUMN (SQLite has no IF NOT EXISTS for them), so a migration renumbered at a merge
    runs again harmlessly on a file that had it under its old number."""
    match = _ADD_COLUMN.match(statement)
    if match is None:
        return False
    table, column = match.groups()
    return any(row[1] == column for row in conn.execute(f"PRAGMA table_info({table})"))


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the schema to VERSION in one write transaction; the version it was at before.

    Several workers may start at once: BEGIN IMMEDIATE makes one of them migrate while
    the others wait, then find nothing left to do.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        before = conn.execute("PRAGMA user_version").fetchone()[0]
        if before > VERSION:
            raise sqlite3.DatabaseError(f"schema version {before} is newer than this server's {VERSION}")
        for script in MIGRATIONS[before:]:
            for statement in filter(str.strip, script.split(";")):
                if not _column_exists(conn, statement):
                    conn.execute(statement)
        if before != VERSION:
            conn.execute(f"PRAGMA user_version = {VERSION}")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return before


def connect(path: str, timeout: float) -> sqlite3.Connection:
    """A connection to the store's file in WAL mode, waiting up to `timeout` for a lock."""
    # isolation_level=None: no implicit transactions; each write says BEGIN IMMEDIATE itself,
    # so two processes never deadlock upgrading a read lock to a write lock.
    conn = sqlite3.connect(path, timeout=timeout, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    # In WAL mode NORMAL loses nothing when the process dies (kill -9): a commit is in the
    # WAL file once it returns. Only an OS crash or power loss can drop the last commits.
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def open_retrying(open_: Callable[[], T], timeout: float) -> T:
    """Open (and migrate) again while another process holds the file's lock, up to `timeout`.

    Two servers started at once on a fresh install both create the file and switch it to
    WAL: SQLite answers one of them "database is locked" at once, without waiting on its
    busy timeout, when the switch meets the other's migration.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            return open_()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(0.05)


def open_problem(path: str, exc: Exception) -> str:
    """Why the store's file cannot be opened, in an operator's words."""
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        return f"the folder {folder} does not exist"
    if not os.access(folder, os.W_OK | os.X_OK):
        # SQLite's WAL mode writes files beside the database, so the folder must be writable.
        return f"the folder {folder} is not writable by this user (the WAL files live beside the file)"
    return getattr(exc, "strerror", None) or str(exc)
