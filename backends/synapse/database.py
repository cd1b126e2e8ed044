"""Synapse's database, read only: SQLite with Python's own module, PostgreSQL with psycopg 3
(an optional install: requirements-migrate.txt).

Everything is read inside one read-only transaction, so the tables agree with each other
even if something writes meanwhile (SQLite: one read transaction on a `mode=ro`
connection; PostgreSQL: REPEATABLE READ, READ ONLY). Rows stream in batches (PostgreSQL
through server-side cursors), never a whole table in memory, and every stream is sorted
by user ID in code-point order, so `accounts()` puts each user together with their
devices, tokens, addresses and profile by walking the streams side by side (a merge, one
pass over each table).

Every failure is `SynapseReadError`, one line naming the database (never its password).
"""

from __future__ import annotations

import os
import sqlite3
import urllib.parse
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from backends.synapse.config import DatabaseSettings
from backends.synapse.rows import (
    SynapseAccessToken,
    SynapseAccount,
    SynapseDevice,
    SynapseProfile,
    SynapseRefreshToken,
    SynapseThreepid,
    SynapseUser,
)

if TYPE_CHECKING:
    import psycopg

T = TypeVar("T")

# The oldest schema whose tables hold every column read here (users.suspended, delta 85).
MIN_SCHEMA_VERSION = 85
INSTALL_DRIVER = (
    "reading a PostgreSQL Synapse needs psycopg 3: install it with "
    "`pip install --require-hashes -r constraints-migrate.txt` (or `pip install 'psycopg[binary]'`)"
)
# Tables the migration reads; a database without them is not a Synapse's.
TABLES = ("users", "devices", "access_tokens", "refresh_tokens", "user_threepids", "profiles", "user_external_ids")
VISIBLE = "NOT COALESCE({}hidden, FALSE)"


class SynapseReadError(Exception):
    """Synapse's database cannot be read (missing, refused, not Synapse's, too old): one line."""


def _one_line(exc: BaseException) -> str:
    return "; ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__


class _Stream(Generic[T]):
    """A sorted stream of rows with one row of look-ahead, for the merge by user ID."""

    def __init__(self, rows: Iterator[T], key: Callable[[T], str]) -> None:
        self._rows = rows
        self._key = key
        self._head: T | None = next(rows, None)
        self.skipped = 0  # rows of users that are not in `users`

    def take(self, user_id: str) -> list[T]:
        found: list[T] = []
        while self._head is not None:
            key = self._key(self._head)
            if key > user_id:
                break
            if key == user_id:
                found.append(self._head)
            else:
                self.skipped += 1
            self._head = next(self._rows, None)
        return found

    def drain(self) -> None:
        while self._head is not None:
            self.skipped += 1
            self._head = next(self._rows, None)


class SynapseDatabase:
    """One open, read-only view of Synapse's main database. Use as a context manager."""

    def __init__(self, settings: DatabaseSettings, connection: Any, *, batch_size: int = 5000) -> None:
        self.settings = settings
        self.where = settings.describe()
        self.postgres = settings.engine == "psycopg2"
        self._conn = connection
        self._cursors = 0
        self.batch_size = batch_size
        # PostgreSQL sorts by the database's collation unless told: byte order, as Python compares.
        self._collate = ' COLLATE "C"' if self.postgres else ""
        self.schema_version = 0
        self.orphans = 0  # rows of user IDs `users` lacks, seen by `accounts`

    # -- opening and closing -------------------------------------------------------------

    @classmethod
    def open(cls, settings: DatabaseSettings, *, batch_size: int = 5000) -> SynapseDatabase:
        """Connect, start the one read-only transaction and check the schema."""
        connection = _open_postgres(settings) if settings.engine == "psycopg2" else _open_sqlite(settings)
        database = cls(settings, connection, batch_size=batch_size)
        try:
            database._check_schema()
        except BaseException:
            database.close()
            raise
        return database

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            conn.rollback()  # the read-only transaction: nothing to keep
            conn.close()
        except Exception:  # closing a read-only view: nothing to lose
            pass

    def __enter__(self) -> SynapseDatabase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_schema(self) -> None:
        present = set(self.tables())
        if "schema_version" not in present:
            raise SynapseReadError(f"{self.where} is not a Synapse database (it has no schema_version table)")
        missing = [t for t in TABLES if t not in present]
        if missing:
            raise SynapseReadError(f"{self.where} is not a Synapse database (no {', '.join(missing)} table)")
        row = next(self._rows("SELECT version FROM schema_version"), None)
        self.schema_version = int(row[0]) if row else 0
        if self.schema_version < MIN_SCHEMA_VERSION:
            raise SynapseReadError(
                f"{self.where} has Synapse's schema {self.schema_version}; reading it needs schema "
                f"{MIN_SCHEMA_VERSION} or newer: upgrade Synapse and start it once first"
            )

    def tables(self) -> list[str]:
        if self.postgres:
            sql = "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        else:
            sql = "SELECT name FROM sqlite_master WHERE type = 'table'"
        return [str(row[0]) for row in self._rows(sql)]

    # -- reading -------------------------------------------------------------------------

    def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
        """The rows of one query, fetched `batch_size` at a time."""
        if self._conn is None:
            raise SynapseReadError(f"{self.where}: already closed")
        if self.postgres:
            sql = sql.replace("?", "%s")
        try:
            if self.postgres:
                self._cursors += 1
                with self._conn.cursor(name=f"synapse_read_{self._cursors}") as cursor:
                    cursor.itersize = self.batch_size
                    cursor.execute(sql, params or None)
                    while batch := cursor.fetchmany(self.batch_size):
                        yield from batch
            else:
                cursor = self._conn.execute(sql, params)
                try:
                    while batch := cursor.fetchmany(self.batch_size):
                        yield from batch
                finally:
                    cursor.close()
        except SynapseReadError:
            raise
        except Exception as exc:
            if not _driver_error(exc):
                raise
            raise SynapseReadError(f"reading {self.where} failed: {_one_line(exc)}") from None

    def count(self, table: str, where: str = "") -> int:
        if table not in TABLES:
            raise ValueError(table)
        row = next(self._rows(f"SELECT COUNT(*) FROM {table}" + (f" WHERE {where}" if where else "")))
        return int(row[0])

    def users(self) -> Iterator[SynapseUser]:
        sql = (
            "SELECT name, password_hash, admin, deactivated, locked, suspended, shadow_banned, is_guest,"
            " appservice_id, user_type, approved, creation_ts"
            f" FROM users ORDER BY name{self._collate}"
        )
        for r in self._rows(sql):
            yield SynapseUser(
                r[0], r[1], bool(r[2]), bool(r[3]), bool(r[4]), bool(r[5]), bool(r[6]), bool(r[7]), r[8], r[9],
                r[10] is None or bool(r[10]), r[11],
            )

    def devices(self) -> Iterator[SynapseDevice]:
        """Every device a person sees (not the `hidden` rows of cross-signing keys)."""
        sql = (
            "SELECT user_id, device_id, display_name, last_seen, ip, user_agent FROM devices"
            f" WHERE {VISIBLE.format('')} ORDER BY user_id{self._collate}, device_id{self._collate}"
        )
        for r in self._rows(sql):
            yield SynapseDevice(r[0], r[1], r[2], r[3], r[4], r[5])

    def access_tokens(self) -> Iterator[SynapseAccessToken]:
        """Every access token, expired and impersonating ones too (`fate` sorts them)."""
        sql = (
            "SELECT t.id, t.user_id, t.device_id, t.token, t.valid_until_ms, t.puppets_user_id,"
            " t.refresh_token_id, t.used, t.last_validated, d.device_id IS NOT NULL"
            " FROM access_tokens t LEFT JOIN devices d"
            f" ON d.user_id = t.user_id AND d.device_id = t.device_id AND {VISIBLE.format('d.')}"
            f" ORDER BY t.user_id{self._collate}, t.id"
        )
        for r in self._rows(sql):
            yield SynapseAccessToken(r[0], r[1], r[2], r[3], r[4], r[5], r[6], bool(r[7]), r[8], bool(r[9]))

    def refresh_tokens(self) -> Iterator[SynapseRefreshToken]:
        """Every refresh token, with its successor's state (`fate` sorts them). The successors'
        states are read first into two sets of ids (rotated tokens only: Synapse keeps at
        most two per session), as `access_tokens.refresh_token_id` has no index to join on."""
        used = {int(r[0]) for r in self._rows(
            "SELECT refresh_token_id FROM access_tokens WHERE refresh_token_id IS NOT NULL AND used"
        )}
        refreshed = {int(r[0]) for r in self._rows("SELECT id FROM refresh_tokens WHERE next_token_id IS NOT NULL")}
        sql = (
            "SELECT rt.id, rt.user_id, rt.device_id, rt.token, rt.next_token_id, rt.expiry_ts,"
            " rt.ultimate_session_expiry_ts, d.device_id IS NOT NULL"
            " FROM refresh_tokens rt LEFT JOIN devices d"
            f" ON d.user_id = rt.user_id AND d.device_id = rt.device_id AND {VISIBLE.format('d.')}"
            f" ORDER BY rt.user_id{self._collate}, rt.id"
        )
        for r in self._rows(sql):
            following = r[4]
            yield SynapseRefreshToken(
                r[0], r[1], r[2], r[3], following, r[5], r[6],
                following is not None and following in used,
                following is not None and following in refreshed,
                bool(r[7]),
            )

    def threepids(self) -> Iterator[SynapseThreepid]:
        sql = (
            "SELECT user_id, medium, address, validated_at, added_at FROM user_threepids"
            f" ORDER BY user_id{self._collate}, added_at, address{self._collate}"
        )
        for r in self._rows(sql):
            yield SynapseThreepid(r[0], r[1], r[2], r[3], r[4])

    def profiles(self, server_name: str) -> Iterator[SynapseProfile]:
        """Display names and avatars; `profiles.user_id` is the localpart (full_user_id is
        newer and may be empty on old rows), so the full ID is made from `server_name`."""
        full = "COALESCE(full_user_id, '@' || user_id || ':' || ?)"
        sql = f"SELECT {full}, displayname, avatar_url FROM profiles ORDER BY {full}{self._collate}"
        for r in self._rows(sql, (server_name, server_name)):
            yield SynapseProfile(r[0], r[1], r[2])

    def external_id_counts(self) -> dict[str, int]:
        """Users linked to each SSO provider (`user_external_ids.auth_provider`)."""
        sql = "SELECT auth_provider, COUNT(*) FROM user_external_ids GROUP BY auth_provider ORDER BY auth_provider"
        return {str(r[0]): int(r[1]) for r in self._rows(sql)}

    def accounts(self, server_name: str) -> Iterator[SynapseAccount]:
        """Each user with their devices, access and refresh tokens, addresses and profile,
        one pass over each table. Rows of user IDs `users` lacks are counted in `orphans`."""
        devices = _Stream(self.devices(), lambda row: row.user_id)
        access = _Stream(self.access_tokens(), lambda row: row.user_id)
        refresh = _Stream(self.refresh_tokens(), lambda row: row.user_id)
        threepids = _Stream(self.threepids(), lambda row: row.user_id)
        profiles = _Stream(self.profiles(server_name), lambda row: row.user_id)
        streams: tuple[_Stream[Any], ...] = (devices, access, refresh, threepids, profiles)
        for user in self.users():
            found = profiles.take(user.user_id)
            yield SynapseAccount(
                user,
                devices.take(user.user_id),
                access.take(user.user_id),
                refresh.take(user.user_id),
                threepids.take(user.user_id),
                found[0] if found else None,
            )
        for stream in streams:
            stream.drain()
        self.orphans = sum(stream.skipped for stream in streams)


def _driver_error(exc: Exception) -> bool:
    if isinstance(exc, sqlite3.Error):
        return True
    try:
        import psycopg
    except ImportError:
        return False
    return isinstance(exc, psycopg.Error)


def wal_pending(path: str) -> bool:
    """A SQLite database has writes in its -wal file not yet in the file itself: a Synapse is
    running on it (or stopped without closing it)."""
    try:
        return os.path.getsize(path + "-wal") > 0
    except OSError:
        return False


def _open_sqlite(settings: DatabaseSettings) -> sqlite3.Connection:
    path = settings.sqlite_path
    where = settings.describe()
    if not os.path.isfile(path):
        raise SynapseReadError(f"{where}: no such file")
    if not os.access(path, os.R_OK):
        raise SynapseReadError(f"{where}: not readable by this user")
    # Synapse keeps SQLite in WAL mode. A read-only connection to a WAL database makes the
    # -wal and -shm files when they are missing, and leaves them behind owned by whoever ran
    # this (root, perhaps): a stopped Synapse could then not open its own database. So with
    # no write-ahead log to read, the file alone is read, as immutable (nothing made, no
    # locks); with one, it is read through the files that are there.
    wal, shm = path + "-wal", path + "-shm"
    options = "mode=ro"
    if not wal_pending(path):
        options += "&immutable=1"
    elif not os.path.exists(shm):
        raise SynapseReadError(
            f"{where}: it has a write-ahead log ({wal}) but no {shm}: Synapse did not stop cleanly; "
            "start and stop it once, then read again"
        )
    try:
        conn = sqlite3.connect(
            "file:" + urllib.parse.quote(path) + "?" + options, uri=True, isolation_level=None,
            check_same_thread=False,
        )
        conn.execute("BEGIN")  # one snapshot for every read that follows
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
    except sqlite3.Error as exc:
        raise SynapseReadError(f"cannot read {where}: {_one_line(exc)}") from None
    return conn


def _open_postgres(settings: DatabaseSettings) -> psycopg.Connection[tuple[Any, ...]]:
    try:
        import psycopg
        import psycopg.conninfo
    except ImportError:
        raise SynapseReadError(INSTALL_DRIVER) from None
    keywords = dict(settings.postgres)
    keywords.setdefault("application_name", "homeserver migrate-synapse")
    keywords.setdefault("connect_timeout", "10")
    try:
        conninfo = psycopg.conninfo.make_conninfo(settings.dsn, **keywords)
    except psycopg.Error:
        # Not libpq's words: they quote the text, and a DSN may hold the password.
        raise SynapseReadError(f"cannot read {settings.describe()}: its dsn is not a valid connection string") from None
    try:
        conn = psycopg.connect(conninfo)
        conn.read_only = True
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    except psycopg.Error as exc:
        raise SynapseReadError(f"cannot connect to {settings.describe()}: {_one_line(exc)}") from None
    return conn
