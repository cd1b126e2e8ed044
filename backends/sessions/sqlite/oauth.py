"""The OAuth store (backends.sessions.oauth) in the SQLite session store's file, on its writer thread.

Its tables are born in the session file's migrations (schema.py, 5 and 6); expired rows go
with the file's purge. A refresh is one write transaction (`refresh_grant`: the grant rotated, the new access
token's session opened), its reads on the loop's read connection.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from backends.sessions.oauth import ENDED, RACED, REFRESHED, RETIRED_REFRESH_TTL, CodeRecord, Grant, OAuthStore
from backends.sessions.records import Session
from backends.sessions.sqlite.file import SqliteFile
from backends.sessions.sqlite.oauth_device import SqliteDeviceCodes

T = TypeVar("T")

def _ms(seconds: float = 0.0) -> int:
    return int((time.time() + seconds) * 1000)


class SqliteOAuthStore(SqliteDeviceCodes, OAuthStore):
    """On the session store's file (`db`, file.SqliteFile): writes on its writer thread, the
    refresh path's reads on the loop's read connection. A refresh opens its access token's
    session as the session store does (`open_session`: SqliteSessionStore.insert), in its
    own transaction. Expired rows go with the file's purge."""

    def __init__(
        self, db: SqliteFile, *, open_session: Callable[[sqlite3.Connection, Session, str | None], None]
    ) -> None:
        super().__init__(db)
        self._open_session = open_session
        db.on_purge(self._purge)

    async def _read(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """`work` reading on the writer thread's connection (autocommit: no write lock taken)."""
        result: T = await self.db.write(lambda: work(self.db.conn()))
        return result

    async def _read_here(self, sql: str, args: tuple[Any, ...]) -> Any:
        """One row read on the loop's read connection (a reader never waits for the writer)."""
        return self.db.read(sql, args)

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """`work` in one write transaction on the session store's writer thread (the file's
        own transaction: a failed COMMIT is rolled back there)."""
        result: T = await self.db.write(self.db.transaction(work))
        await self.db.purge_now_and_then()
        return result

    @staticmethod
    def _purge(conn: sqlite3.Connection) -> None:
        ms = _ms()
        conn.execute("DELETE FROM oauth_codes WHERE expires_ts < ?", (ms,))
        conn.execute("DELETE FROM oauth_refresh WHERE expires_ts < ?", (ms,))
        conn.execute("DELETE FROM oauth_grants WHERE expires_ts < ?", (ms,))
        # Idle clients go, unless a grant of theirs lives (the spec: never a client with a session).
        conn.execute(
            "DELETE FROM oauth_clients WHERE expires_ts < ? AND NOT EXISTS "
            "(SELECT 1 FROM oauth_grants g WHERE g.client_id = oauth_clients.client_id)",
            (ms,),
        )

    # -- clients --------------------------------------------------------------------

    async def add_client(self, client_id: str, metadata: dict[str, Any], idle: float) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO oauth_clients (client_id, metadata, expires_ts) VALUES (?, ?, ?)",
                (client_id, json.dumps(metadata), _ms(idle)),
            )

        await self._run(work)

    async def client(self, client_id: str) -> dict[str, Any] | None:
        def work(conn: sqlite3.Connection) -> dict[str, Any] | None:
            row = conn.execute(
                "SELECT c.metadata FROM oauth_clients c WHERE c.client_id = ? AND (c.expires_ts >= ? OR EXISTS "
                "(SELECT 1 FROM oauth_grants g WHERE g.client_id = c.client_id))",
                (client_id, _ms()),
            ).fetchone()
            return json.loads(row[0]) if row else None

        return await self._read(work)

    async def touch_client(self, client_id: str, idle: float) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE oauth_clients SET expires_ts = MAX(expires_ts, ?) WHERE client_id = ?", (_ms(idle), client_id)
            )

        await self._run(work)

    # -- codes ----------------------------------------------------------------------

    async def add_code(self, code_hash: str, record: CodeRecord, ttl: float) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO oauth_codes (code_hash, record, expires_ts) VALUES (?, ?, ?)",
                (code_hash, record.encode(), _ms(ttl)),
            )

        await self._run(work)

    async def take_code(self, code_hash: str) -> tuple[CodeRecord, int] | None:
        def work(conn: sqlite3.Connection) -> tuple[CodeRecord, int] | None:
            row = conn.execute(
                "UPDATE oauth_codes SET uses = uses + 1 WHERE code_hash = ? AND expires_ts >= ? RETURNING record, uses",
                (code_hash, _ms()),
            ).fetchone()
            return (CodeRecord.decode(row[0]), int(row[1])) if row else None

        return await self._run(work)

    async def give_back_code(self, code_hash: str, uses: int) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute("UPDATE oauth_codes SET uses = uses - 1 WHERE code_hash = ? AND uses = ?", (code_hash, uses))

        await self._run(work)

    # -- grants ---------------------------------------------------------------------

    def _insert_grant(self, conn: sqlite3.Connection, grant: Grant, idle: float) -> None:
        expires = _ms(idle)
        conn.execute(
            "INSERT INTO oauth_grants (grant_id, user, device_id, client_id, record, expires_ts) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (grant_id) DO UPDATE SET record = excluded.record, "
            "expires_ts = excluded.expires_ts",
            (grant.grant_id, grant.user, grant.device_id, grant.client_id, grant.encode(), expires),
        )
        conn.execute(
            "INSERT OR REPLACE INTO oauth_refresh (refresh_hash, grant_id, expires_ts) VALUES (?, ?, ?)",
            (grant.refresh_hash, grant.grant_id, expires),
        )

    @staticmethod
    def insert_grants(conn: sqlite3.Connection, grants: list[tuple[Grant, float]]) -> None:
        """Record grants made elsewhere (a move from Synapse: no grant of their devices yet)
        inside a write transaction, each kept its idle seconds; their current and previous
        refresh tokens are found. A grant or refresh token already there is left as it is."""
        conn.executemany(
            "INSERT OR IGNORE INTO oauth_grants (grant_id, user, device_id, client_id, record, expires_ts) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [(g.grant_id, g.user, g.device_id, g.client_id, g.encode(), _ms(idle)) for g, idle in grants],
        )
        conn.executemany(
            "INSERT OR IGNORE INTO oauth_refresh (refresh_hash, grant_id, expires_ts) VALUES (?, ?, ?)",
            [(digest, g.grant_id, _ms(idle)) for g, idle in grants
             for digest in (g.refresh_hash, g.previous_hash) if digest],
        )

    async def add_grant(self, grant: Grant, idle: float) -> None:
        def work(conn: sqlite3.Connection) -> None:
            for (old,) in conn.execute(
                "SELECT grant_id FROM oauth_grants WHERE user = ? AND device_id = ?", (grant.user, grant.device_id)
            ).fetchall():
                self._delete(conn, old)
            self._insert_grant(conn, grant, idle)

        await self._run(work)

    async def grant_by_refresh(self, refresh_hash: str) -> Grant | None:
        now = _ms()
        row = await self._read_here(
            "SELECT g.record FROM oauth_refresh r JOIN oauth_grants g ON g.grant_id = r.grant_id "
            "WHERE r.refresh_hash = ? AND r.expires_ts >= ? AND g.expires_ts >= ?",
            (refresh_hash, now, now),
        )
        return Grant.decode(row[0]) if row else None

    def _rotate(self, conn: sqlite3.Connection, expected_refresh_hash: str, grant: Grant, idle: float) -> bool:
        row = conn.execute("SELECT record FROM oauth_grants WHERE grant_id = ?", (grant.grant_id,)).fetchone()
        old = Grant.decode(row[0]) if row is not None else None
        if old is None or old.refresh_hash != expected_refresh_hash:
            return False
        self._insert_grant(conn, grant, idle)
        # Refresh tokens older than the previous one are only remembered a while, to see a replay:
        # the one (or two) this rotation retires, by key (the grant's earlier ones were capped
        # when they were retired; all of them here would make each refresh cost as many rows).
        for retired in {old.previous_hash, old.refresh_hash} - {grant.refresh_hash, grant.previous_hash, ""}:
            conn.execute(
                "UPDATE oauth_refresh SET expires_ts = MIN(expires_ts, ?) WHERE refresh_hash = ? AND grant_id = ?",
                (_ms(RETIRED_REFRESH_TTL), retired, grant.grant_id),
            )
        return True

    async def rotate_grant(self, expected_refresh_hash: str, grant: Grant, idle: float) -> bool:
        return await self._run(lambda conn: self._rotate(conn, expected_refresh_hash, grant, idle))

    async def refresh_grant(
        self, expected_refresh_hash: str, grant: Grant, idle: float, access: Session, *,
        grant_session: str, end_access: str = "", client_idle: float | None = None,
    ) -> str:
        def work(conn: sqlite3.Connection) -> str:
            # The grant's session is read in the transaction: an end by any process is either
            # committed before it (seen here) or after it (and ends the new session with the device).
            open_ = conn.execute(
                "SELECT 1 FROM sessions WHERE token_hash = ? AND user = ? AND ended_ts IS NULL "
                "AND (expires_ts IS NULL OR expires_ts > ?)",
                (grant_session, grant.user, _ms()),
            ).fetchone()
            if not self._rotate(conn, expected_refresh_hash, grant, idle):
                return RACED
            if open_ is None:
                self._delete(conn, grant.grant_id)
                return ENDED
            self._open_session(conn, access, None)
            if end_access:
                conn.execute(
                    "UPDATE sessions SET ended_ts = ? WHERE token_hash = ? AND user = ? AND ended_ts IS NULL",
                    (_ms(), end_access, grant.user),
                )
            if client_idle is not None:
                conn.execute(
                    "UPDATE oauth_clients SET expires_ts = MAX(expires_ts, ?) WHERE client_id = ?",
                    (_ms(client_idle), grant.client_id),
                )
            return REFRESHED

        # One transaction. Only the end of an access token's session (which a process may keep:
        # a lost answer's token, seen unused but perhaps in use) moves the change counter: the
        # usual refresh leaves every process's kept sessions standing (changes.py).
        outcome: str = await self.db.write(self.db.transaction(work, ends=bool(end_access)))
        if outcome == REFRESHED:
            await self.db.purge_now_and_then()
        return outcome

    async def device_grant(self, user: str, device_id: str) -> Grant | None:
        def work(conn: sqlite3.Connection) -> Grant | None:
            row = conn.execute(
                "SELECT record FROM oauth_grants WHERE user = ? AND device_id = ? AND expires_ts >= ?",
                (user, device_id, _ms()),
            ).fetchone()
            return Grant.decode(row[0]) if row else None

        return await self._read(work)

    @staticmethod
    def _delete(conn: sqlite3.Connection, grant_id: str) -> None:
        conn.execute("DELETE FROM oauth_refresh WHERE grant_id = ?", (grant_id,))
        conn.execute("DELETE FROM oauth_grants WHERE grant_id = ?", (grant_id,))

    async def delete_grant(self, grant: Grant) -> None:
        await self._run(lambda conn: self._delete(conn, grant.grant_id))

    async def mark_access_used(self, user: str, device_id: str, access_hash: str) -> bool:
        # Read first on the loop's connection: the first use of any other expiring session (a
        # password login's, with `[auth] token_lifetime`) costs no write.
        row = await self._read_here(
            "SELECT record FROM oauth_grants WHERE user = ? AND device_id = ?", (user, device_id)
        )
        seen = Grant.decode(row[0]) if row is not None else None
        if seen is None or seen.access_hash != access_hash or seen.access_used:
            return False

        def work(conn: sqlite3.Connection) -> bool:
            row = conn.execute(
                "SELECT record FROM oauth_grants WHERE user = ? AND device_id = ?", (user, device_id)
            ).fetchone()
            grant = Grant.decode(row[0]) if row is not None else None
            if grant is None or grant.access_hash != access_hash or grant.access_used:
                return False
            conn.execute(
                "UPDATE oauth_grants SET record = ? WHERE grant_id = ?",
                (replace(grant, access_used=True).encode(), grant.grant_id),
            )
            return True

        return await self._run(work)

    async def access_used(self, user: str, token_hash: str) -> bool | None:
        row = await self._read_here(
            "SELECT created_ts, last_seen_ts, ended_ts FROM sessions WHERE token_hash = ? AND user = ? "
            "AND (expires_ts IS NULL OR expires_ts > ?)",
            (token_hash, user, _ms()),
        )
        return None if row is None else row[2] is not None or row[1] > row[0]
