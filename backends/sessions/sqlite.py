"""SQLite session store (the default): one WAL file shared by every worker process on a host."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypeVar

from backends.base import ConfigError, StoreUnavailable, resolve_path
from backends.sessions.base import Device, Session, SessionStore
from backends.sessions.sqlite_changes import ChangeCounter
from backends.sessions.sqlite_schema import connect, migrate, open_problem, open_retrying

logger = logging.getLogger(__name__)

T = TypeVar("T")
STORE = "session store"
# Tombstones and expired sessions are purged at most this often (seconds), by the writer.
PURGE_EVERY = 600.0
_SESSION_COLUMNS = (
    "token_hash, user, device_id, created_ts, last_seen_ip, last_seen_ts, expires_ts, ended_ts, "
    "identity_fp, password_fp"
)
_GET = f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE token_hash = ?"
KEPT_SESSIONS = 10_000  # sessions (and absences) a process keeps; past this, it starts afresh


def _now_ms() -> int:
    return int(time.time() * 1000)


class SqliteSessionStore(SessionStore):
    """Sessions in one SQLite file (WAL): safe for several processes on one host.

    Writes run on one thread of their own, never on the event loop. The hot-path read
    (`get`) runs on the loop, on a read connection of its own (in WAL mode a reader never
    waits for a writer), and keeps what it read while the processes' shared change counter
    says nothing was written since (sqlite_changes).
    """

    name = "sqlite"

    def __init__(self, path: str, *, timeout: float = 2.0, keep_ended: float = 30 * 86400) -> None:
        self.path = path
        self.timeout = timeout
        self.keep_ended_ms = int(keep_ended * 1000)
        self._writer: concurrent.futures.ThreadPoolExecutor | None = None
        self._write_conn: sqlite3.Connection | None = None
        self._read_conn: sqlite3.Connection | None = None
        self._last_purge = 0.0
        self._changes: ChangeCounter | None = None
        # token_hash -> (the session, the change counter's value it was read at)
        self._kept: dict[str, tuple[Session, int]] = {}

    @classmethod
    def from_config(cls, options: dict[str, Any], *, config_dir: str) -> SqliteSessionStore:
        path = options["path"]
        return cls(
            resolve_path(path, config_dir),
            timeout=options["timeout"],
            keep_ended=options["keep_ended"],
        )

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sessions-sqlite")
        try:
            self._changes = ChangeCounter(self.path)
            await self._write(self._open_writer)
            # The read connection is opened here, on the loop's thread, and used only there;
            # its hot-path reads wait at most 0.2 s for a lock.
            self._read_conn = open_retrying(lambda: connect(self.path, 0.2), self.timeout)
            self._read_conn.execute("PRAGMA query_only=1")
        except (sqlite3.Error, OSError, StoreUnavailable) as exc:
            await self.close()
            raise ConfigError(f"sessions.sqlite.path: {self.path}: {open_problem(self.path, exc)}") from None

    def _open_writer(self) -> None:
        if not os.path.exists(self.path):
            try:
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            except FileExistsError:
                pass  # another worker made it first
        def open_and_migrate() -> sqlite3.Connection:
            conn = connect(self.path, self.timeout)
            try:
                with self._counter().writing():
                    migrate(conn)
            except BaseException:
                conn.close()
                raise
            return conn

        self._write_conn = open_retrying(open_and_migrate, self.timeout)

    async def close(self) -> None:
        self._kept.clear()
        if self._read_conn is not None:
            self._read_conn.close()
            self._read_conn = None
        if self._writer is not None:
            writer, self._writer = self._writer, None
            if self._write_conn is not None:
                conn, self._write_conn = self._write_conn, None
                await asyncio.get_running_loop().run_in_executor(writer, conn.close)
            writer.shutdown(wait=False)
        if self._changes is not None:
            self._changes.close()
            self._changes = None

    async def check_health(self) -> None:
        await self._write(lambda: self._conn().execute("SELECT 1").fetchone())

    # -- plumbing -------------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        if self._write_conn is None:
            raise StoreUnavailable("not started", store=STORE)
        return self._write_conn

    def _counter(self) -> ChangeCounter:
        if self._changes is None:
            raise StoreUnavailable("not started", store=STORE)
        return self._changes

    async def _write(self, work: Callable[[], T]) -> T:
        """Run `work` on the writer thread; StoreUnavailable when it fails or takes too long."""
        if self._writer is None:
            raise StoreUnavailable("not started", store=STORE)
        future = asyncio.get_running_loop().run_in_executor(self._writer, work)
        try:
            return await asyncio.wait_for(future, self.timeout + 1.0)
        except TimeoutError:
            raise StoreUnavailable(f"{self.path}: timed out", store=STORE) from None
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"{self.path}: {exc}", store=STORE) from None

    def _transaction(self, work: Callable[[sqlite3.Connection], T], *, ends: bool = False) -> Callable[[], T]:
        """A write transaction. `ends`: it may end or remove a session, so it moves the change
        counter and every process reads its kept sessions again; the other writes (a session
        opened, a last-seen touch, a rate step, delegation marks) change nothing a process
        keeps, as Synapse invalidates only the key it changed."""

        def run() -> T:
            conn = self._conn()
            with self._counter().writing() if ends else contextlib.nullcontext():
                conn.execute("BEGIN IMMEDIATE")
                try:
                    result = work(conn)
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            return result

        return run

    # -- sessions -------------------------------------------------------------------

    async def open(self, session: Session, display_name: str | None) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute(
                f"INSERT INTO sessions ({_SESSION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?, ?)",
                (session.token_hash, session.user, session.device_id, session.created_ts,
                 session.last_seen_ip, session.last_seen_ts, session.expires_ts,
                 session.identity_fp, session.password_fp),
            )
            conn.execute(
                "INSERT OR IGNORE INTO devices (user, device_id, display_name) VALUES (?, ?, ?)",
                (session.user, session.device_id, display_name or ""),
            )

        # A new session changes nothing a process keeps (absences are not kept, see `get`).
        await self._write(self._transaction(work))
        if time.monotonic() - self._last_purge >= PURGE_EVERY:
            self._last_purge = time.monotonic()
            await self._write(self._transaction(self._purge, ends=True))

    async def get(self, user: str, token_hash: str) -> Session | None:
        if self._read_conn is None or self._changes is None:
            raise StoreUnavailable("not started", store=STORE)
        # What was read at this counter value is the file's still (sqlite_changes).
        seen = self._changes.value()
        kept = self._kept.get(token_hash)
        session: Session | None
        if kept is not None and kept[1] == seen:
            session = kept[0]
        else:
            try:
                row = self._read_conn.execute(_GET, (token_hash,)).fetchone()
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"{self.path}: {exc}", store=STORE) from None
            session = None if row is None else Session(*row)
            # An absence is not kept: a login may open that token's session without moving
            # the counter. A kept session changes only by its end (or purge), which moves it.
            if session is not None and not seen & 1 and self._changes.value() == seen:
                if len(self._kept) >= KEPT_SESSIONS:
                    self._kept.clear()
                self._kept[token_hash] = (session, seen)
        if session is None or session.user != user:
            return None
        if session.expires_ts is not None and session.expires_ts <= _now_ms():
            return None
        return session

    async def touch(self, user: str, token_hash: str, ip: str, ts: int) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE sessions SET last_seen_ip = ?, last_seen_ts = ? "
                "WHERE token_hash = ? AND user = ? AND ended_ts IS NULL",
                (ip, ts, token_hash, user),
            )

        await self._write(self._transaction(work))

    async def end(self, user: str, token_hash: str) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            row = conn.execute(
                "UPDATE sessions SET ended_ts = ? WHERE token_hash = ? AND user = ? AND ended_ts IS NULL "
                "RETURNING device_id",
                (_now_ms(), token_hash, user),
            ).fetchone()
            if row is None:
                return False
            self._drop_unused_devices(conn, user, [row[0]])
            return True

        return await self._write(self._transaction(work, ends=True))

    async def end_devices(self, user: str, device_ids: list[str] | None) -> int:
        def work(conn: sqlite3.Connection) -> int:
            now = _now_ms()
            if device_ids is None:
                cursor = conn.execute(
                    "UPDATE sessions SET ended_ts = ? WHERE user = ? AND ended_ts IS NULL", (now, user)
                )
                conn.execute("DELETE FROM devices WHERE user = ?", (user,))
                return cursor.rowcount
            count = 0
            for device_id in dict.fromkeys(device_ids):
                count += conn.execute(
                    "UPDATE sessions SET ended_ts = ? WHERE user = ? AND device_id = ? AND ended_ts IS NULL",
                    (now, user, device_id),
                ).rowcount
            self._drop_unused_devices(conn, user, device_ids)
            return count

        return await self._write(self._transaction(work, ends=True))

    async def end_stale(self, user: str, identity_fps: list[str], password_fps: list[str] | None) -> list[str]:
        stale = f"identity_fp NOT IN ({', '.join('?' * len(identity_fps))})"
        args: list[Any] = [user, *identity_fps]
        if password_fps is not None:
            stale += f" OR (password_fp IS NOT NULL AND password_fp NOT IN ({', '.join('?' * len(password_fps))}))"
            args += password_fps
        where = f"user = ? AND ended_ts IS NULL AND identity_fp IS NOT NULL AND ({stale})"

        def work(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(
                f"UPDATE sessions SET ended_ts = ? WHERE {where} RETURNING device_id", [_now_ms(), *args]
            ).fetchall()
            devices = [row[0] for row in rows]
            self._drop_unused_devices(conn, user, devices)
            return devices

        def run() -> list[str]:
            # The sweep asks this of every user each time: a read first, so the usual "none"
            # takes no write lock from the other processes.
            if self._conn().execute(f"SELECT 1 FROM sessions WHERE {where} LIMIT 1", args).fetchone() is None:
                return []
            return self._transaction(work, ends=True)()

        return await self._write(run)

    @staticmethod
    def _drop_unused_devices(conn: sqlite3.Connection, user: str, device_ids: list[str]) -> None:
        """A device lives while a session of it is open: forget those with none left."""
        for device_id in dict.fromkeys(device_ids):
            conn.execute(
                "DELETE FROM devices WHERE user = ? AND device_id = ? AND NOT EXISTS ("
                "SELECT 1 FROM sessions WHERE user = ? AND device_id = ? AND ended_ts IS NULL)",
                (user, device_id, user, device_id),
            )

    # -- devices --------------------------------------------------------------------

    def _device_rows(self, conn: sqlite3.Connection, user: str, device_id: str | None) -> list[Device]:
        # SQLite returns the bare columns of the row holding MAX(): the latest session's address.
        where = "s.user = ? AND s.ended_ts IS NULL AND (s.expires_ts IS NULL OR s.expires_ts > ?)"
        args: list[Any] = [user, _now_ms()]
        if device_id is not None:
            where += " AND s.device_id = ?"
            args.append(device_id)
        rows = conn.execute(
            "SELECT s.device_id, COALESCE(d.display_name, ''), s.last_seen_ip, MAX(s.last_seen_ts) "
            "FROM sessions s LEFT JOIN devices d ON d.user = s.user AND d.device_id = s.device_id "
            f"WHERE {where} GROUP BY s.device_id ORDER BY s.device_id",
            args,
        ).fetchall()
        return [Device(*row) for row in rows]

    async def devices(self, user: str) -> list[Device]:
        return await self._write(lambda: self._device_rows(self._conn(), user, None))

    async def device(self, user: str, device_id: str) -> Device | None:
        rows = await self._write(lambda: self._device_rows(self._conn(), user, device_id))
        return rows[0] if rows else None

    async def rename_device(self, user: str, device_id: str, display_name: str) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            if not self._device_rows(conn, user, device_id):
                return False
            conn.execute(
                "INSERT INTO devices (user, device_id, display_name) VALUES (?, ?, ?) "
                "ON CONFLICT (user, device_id) DO UPDATE SET display_name = excluded.display_name",
                (user, device_id, display_name),
            )
            return True

        return await self._write(self._transaction(work))

    async def users(self) -> list[str]:
        rows = await self._write(
            lambda: self._conn().execute("SELECT DISTINCT user FROM sessions WHERE ended_ts IS NULL").fetchall()
        )
        return [row[0] for row in rows]

    # -- delegation -----------------------------------------------------------------

    async def provisioned(self, user: str) -> str | None:
        row = await self._write(
            lambda: self._conn().execute("SELECT digest FROM delegation_users WHERE user = ?", (user,)).fetchone()
        )
        return row[0] if row else None

    async def set_provisioned(self, user: str, digest: str) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO delegation_users (user, digest) VALUES (?, ?) "
                "ON CONFLICT (user) DO UPDATE SET digest = excluded.digest",
                (user, digest),
            )

        await self._write(self._transaction(work))

    async def mark_resync(self, user: str, mark: int) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO delegation_resync (user, mark) VALUES (?, ?) "
                "ON CONFLICT (user) DO UPDATE SET mark = excluded.mark",
                (user, mark),
            )

        await self._write(self._transaction(work))

    async def resyncs(self) -> dict[str, int]:
        rows = await self._write(lambda: self._conn().execute("SELECT user, mark FROM delegation_resync").fetchall())
        return {user: mark for user, mark in rows}

    async def clear_resync(self, user: str, mark: int) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute("DELETE FROM delegation_resync WHERE user = ? AND mark = ?", (user, mark))
            return cursor.rowcount > 0

        return await self._write(self._transaction(work))

    # -- shared rate limits ---------------------------------------------------------

    async def rate_limit(self, key: str, interval: float, capacity: float, *, take: bool = True) -> float:
        if not take:  # a peek: one read on the read connection, no write lock
            if self._read_conn is None:
                raise StoreUnavailable("not started", store=STORE)
            try:
                row = self._read_conn.execute("SELECT full_at FROM rate_limits WHERE key = ?", (key,)).fetchone()
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"{self.path}: {exc}", store=STORE) from None
            now = time.time()
            excess = max(row[0] if row is not None else now, now) + interval - now - capacity
            return excess if excess > 1e-9 else 0.0

        def work(conn: sqlite3.Connection) -> float:
            # The host's clock: every process of one host shares it.
            now = time.time()
            row = conn.execute("SELECT full_at FROM rate_limits WHERE key = ?", (key,)).fetchone()
            full_at = row[0] if row is not None else now
            new_full_at = max(full_at, now) + interval
            excess = new_full_at - now - capacity
            if excess > 1e-9:
                return excess
            conn.execute(
                "INSERT INTO rate_limits (key, full_at) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET full_at = excluded.full_at",
                (key, new_full_at),
            )
            return 0.0

        return await self._write(self._transaction(work))

    # -- upkeep ---------------------------------------------------------------------

    def _purge(self, conn: sqlite3.Connection) -> None:
        """Forget old tombstones, expired sessions and full buckets (after a login, at most every
        PURGE_EVERY s): it removes sessions, so it moves the change counter."""
        now_ms = _now_ms()
        conn.execute(
            "DELETE FROM sessions WHERE (ended_ts IS NOT NULL AND ended_ts < ?) "
            "OR (expires_ts IS NOT NULL AND expires_ts < ?)",
            (now_ms - self.keep_ended_ms, now_ms),
        )
        conn.execute("DELETE FROM rate_limits WHERE full_at < ?", (time.time(),))
