"""SQLite session store (the default): one WAL file shared by every worker process on a host."""

from __future__ import annotations

import logging
import sqlite3
import time
from typing import Any

from backends.base import resolve_path
from backends.sessions.base import SessionStore
from backends.sessions.records import Device, Session
from backends.sessions.sqlite.browser import SqliteBrowserSessions
from backends.sessions.sqlite.buckets import SqliteRateBuckets
from backends.sessions.sqlite.delegation import SqliteDelegationState
from backends.sessions.sqlite.factors import SqliteFactorStore
from backends.sessions.sqlite.file import SqliteFile, SqlitePart
from backends.sessions.sqlite.imported import SqliteImportedState
from backends.sessions.sqlite.login_tokens import SqliteLoginTokens
from backends.sessions.sqlite.oauth import SqliteOAuthStore

logger = logging.getLogger(__name__)

_SESSION_COLUMNS = (
    "token_hash, user, device_id, created_ts, last_seen_ip, last_seen_ts, expires_ts, ended_ts, "
    "identity_fp, password_fp, second_factor"
)
_GET = f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE token_hash = ?"
KEPT_SESSIONS = 10_000  # sessions a process keeps; past this, it starts afresh
# The open sessions of a user (the first argument) that carry fingerprints: the ones the
# credential-fingerprint rule speaks of (those without were opened before; they stay).
_FINGERPRINTED = "user = ? AND ended_ts IS NULL AND identity_fp IS NOT NULL"


def kept_by_fingerprints(identity_fps: list[str], password_fps: list[str] | None) -> tuple[str, list[str]]:
    """The credential-fingerprint rule, written once for SQLite (`end_stale` ends the sessions
    it does not keep, `refingerprint` counts and carries those it keeps; redis/scripts.py's
    `fingerprint_rule` in Lua, homeserver.credentials for one session): a session with
    fingerprints is kept while its identity digest is one of `identity_fps` and, unless
    `password_fps` is None (password changes let pass), its password digest is absent or one
    of those (one digest per signing key). The SQL condition and its arguments."""
    kept = f"identity_fp IN ({', '.join('?' * len(identity_fps))})"
    if password_fps is None:
        return kept, list(identity_fps)
    kept += f" AND (password_fp IS NULL OR password_fp IN ({', '.join('?' * len(password_fps))}))"
    return kept, [*identity_fps, *password_fps]


def _now_ms() -> int:
    return int(time.time() * 1000)


class SqliteSessionStore(SqlitePart, SessionStore):
    """Sessions and devices in one SQLite file (WAL), safe for several processes on one host;
    its other parts (OAuth, the page sign-ins, rate buckets, delegation state) in the same
    file, one object each, behind one door each (`oauth()`, ...).

    The file's plumbing is `db` (file.SqliteFile): writes on its writer thread. The
    hot-path read (`get`) runs on the loop, on the read connection, and keeps what it read
    while the processes' shared change counter says no session ended since (changes.py).
    """

    name = "sqlite"

    def __init__(self, path: str, *, timeout: float = 2.0, keep_ended: float = 30 * 86400) -> None:
        super().__init__(SqliteFile(path, timeout))
        self.keep_ended_ms = int(keep_ended * 1000)
        # token_hash -> (the session, the change counter's value it was read at)
        self._kept: dict[str, tuple[Session, int]] = {}
        self.db.on_purge(self._purge)
        # The other parts, on the same file.
        self._oauth = SqliteOAuthStore(self.db, open_session=self.insert)
        self._browser_sessions = SqliteBrowserSessions(self.db)
        self._buckets = SqliteRateBuckets(self.db)
        self._delegation = SqliteDelegationState(self.db)
        self._login_tokens = SqliteLoginTokens(self.db)
        self._imported = SqliteImportedState(
            self.db, insert_sessions=self.insert_many, insert_grants=self._oauth.insert_grants
        )
        self._factors = SqliteFactorStore(self.db)

    @classmethod
    def from_config(cls, options: dict[str, Any], *, config_dir: str) -> SqliteSessionStore:
        path = options["path"]
        return cls(
            resolve_path(path, config_dir),
            timeout=options["timeout"],
            keep_ended=options["keep_ended"],
        )

    async def start(self) -> None:
        await self.db.start()

    async def close(self) -> None:
        self._kept.clear()
        await self.db.close()

    async def check_health(self) -> None:
        await self.db.write(lambda: self.db.conn().execute("SELECT 1").fetchone())

    # -- the other parts ------------------------------------------------------------

    def oauth(self) -> SqliteOAuthStore:
        return self._oauth

    def browser_sessions(self) -> SqliteBrowserSessions:
        return self._browser_sessions

    def buckets(self) -> SqliteRateBuckets:
        return self._buckets

    def delegation(self) -> SqliteDelegationState:
        return self._delegation

    def login_tokens(self) -> SqliteLoginTokens:
        return self._login_tokens

    def imported(self) -> SqliteImportedState:
        return self._imported

    def factors(self) -> SqliteFactorStore:
        return self._factors

    # -- sessions -------------------------------------------------------------------

    @staticmethod
    def insert(conn: sqlite3.Connection, session: Session, display_name: str | None) -> None:
        """Record a new session (and its device when new) inside a write transaction: `open`'s
        work, also one step of the OAuth store's refresh (oauth.py)."""
        conn.execute(
            f"INSERT INTO sessions ({_SESSION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?)",
            (session.token_hash, session.user, session.device_id, session.created_ts,
             session.last_seen_ip, session.last_seen_ts, session.expires_ts,
             session.identity_fp, session.password_fp, session.second_factor),
        )
        conn.execute(
            "INSERT OR IGNORE INTO devices (user, device_id, display_name) VALUES (?, ?, ?)",
            (session.user, session.device_id, display_name or ""),
        )

    @staticmethod
    def insert_many(conn: sqlite3.Connection, sessions: list[tuple[Session, str | None]]) -> None:
        """Record sessions made elsewhere (a move from Synapse) inside a write transaction; one
        already there (its digest) is left as it is, and so is a device's name."""
        conn.executemany(
            f"INSERT OR IGNORE INTO sessions ({_SESSION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?)",
            [(s.token_hash, s.user, s.device_id, s.created_ts, s.last_seen_ip, s.last_seen_ts, s.expires_ts,
              s.identity_fp, s.password_fp, s.second_factor) for s, _ in sessions],
        )
        conn.executemany(
            "INSERT OR IGNORE INTO devices (user, device_id, display_name) VALUES (?, ?, ?)",
            [(s.user, s.device_id, name or "") for s, name in sessions],
        )

    async def open(self, session: Session, display_name: str | None) -> None:
        # A new session changes nothing a process keeps (absences are not kept, see `get`).
        await self.db.write(self.db.transaction(lambda conn: self.insert(conn, session, display_name)))
        await self.db.purge_now_and_then()

    async def get(self, user: str, token_hash: str) -> Session | None:
        changes = self.db.counter()
        # What was read at this counter value is the file's still (changes.py).
        seen = changes.value()
        kept = self._kept.get(token_hash)
        session: Session | None
        if kept is not None and kept[1] == seen:
            session = kept[0]
        else:
            row = self.db.read(_GET, (token_hash,))
            session = None if row is None else Session(*row)
            # An absence is not kept: a login may open that token's session without moving
            # the counter. A kept session changes only by its end (or purge), which moves it.
            if session is not None and not seen & 1 and changes.value() == seen:
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

        await self.db.write(self.db.transaction(work))

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

        return await self.db.write(self.db.transaction(work, ends=True))

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

        return await self.db.write(self.db.transaction(work, ends=True))

    async def end_stale(self, user: str, identity_fps: list[str], password_fps: list[str] | None) -> list[str]:
        kept, kept_args = kept_by_fingerprints(identity_fps, password_fps)
        where = f"{_FINGERPRINTED} AND NOT ({kept})"
        args: list[Any] = [user, *kept_args]

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
            if self.db.conn().execute(f"SELECT 1 FROM sessions WHERE {where} LIMIT 1", args).fetchone() is None:
                return []
            return self.db.transaction(work, ends=True)()

        return await self.db.write(run)

    async def refingerprint(
        self, user: str, identity_fps: list[str], password_fps: list[str] | None, new: tuple[str, str] | None
    ) -> int:
        kept, kept_args = kept_by_fingerprints(identity_fps, password_fps)
        where = f"{_FINGERPRINTED} AND ({kept})"
        args: list[Any] = [user, *kept_args]
        if new is None:
            return int(await self.db.write(
                lambda: self.db.conn().execute(f"SELECT COUNT(*) FROM sessions WHERE {where}", args).fetchone()[0]
            ))
        update = f"UPDATE sessions SET identity_fp = ?, password_fp = ? WHERE {where}"
        # `ends`: every process reads its kept sessions again (their fingerprints changed).
        work = self.db.transaction(lambda conn: conn.execute(update, [*new, *args]).rowcount, ends=True)
        return await self.db.write(work)

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
        # SQLite returns the bare columns of the row holding MAX(): the latest session's address
        # and second factor.
        where = "s.user = ? AND s.ended_ts IS NULL AND (s.expires_ts IS NULL OR s.expires_ts > ?)"
        args: list[Any] = [user, _now_ms()]
        if device_id is not None:
            where += " AND s.device_id = ?"
            args.append(device_id)
        rows = conn.execute(
            "SELECT s.device_id, COALESCE(d.display_name, ''), s.last_seen_ip, MAX(s.last_seen_ts), s.second_factor "
            "FROM sessions s LEFT JOIN devices d ON d.user = s.user AND d.device_id = s.device_id "
            f"WHERE {where} GROUP BY s.device_id ORDER BY s.device_id",
            args,
        ).fetchall()
        return [Device(*row) for row in rows]

    async def devices(self, user: str) -> list[Device]:
        return await self.db.write(lambda: self._device_rows(self.db.conn(), user, None))

    async def device(self, user: str, device_id: str) -> Device | None:
        rows = await self.db.write(lambda: self._device_rows(self.db.conn(), user, device_id))
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

        return await self.db.write(self.db.transaction(work))

    async def users(self) -> list[str]:
        rows = await self.db.write(
            lambda: self.db.conn().execute("SELECT DISTINCT user FROM sessions WHERE ended_ts IS NULL").fetchall()
        )
        return [row[0] for row in rows]

    # -- upkeep ---------------------------------------------------------------------

    def _purge(self, conn: sqlite3.Connection) -> None:
        """Forget old tombstones and expired sessions (file.SqliteFile.purge_now_and_then)."""
        now_ms = _now_ms()
        conn.execute(
            "DELETE FROM sessions WHERE (ended_ts IS NOT NULL AND ended_ts < ?) "
            "OR (expires_ts IS NOT NULL AND expires_ts < ?)",
            (now_ms - self.keep_ended_ms, now_ms),
        )
