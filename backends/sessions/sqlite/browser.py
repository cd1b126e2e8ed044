"""The account page's sign-ins in the SQLite session store's file (table `page_sessions`), on its writer."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import TypeVar

from backends.sessions.browser import BrowserSession, BrowserSessions
from backends.sessions.sqlite.file import SqlitePart

T = TypeVar("T")
_COLUMNS = "id, user, created, expires, ip, user_agent, second_factor"


class SqliteBrowserSessions(SqlitePart, BrowserSessions):
    """One row per sign-in; an end deletes it, and rows past their lifetime are purged as new
    ones open. Writes go through the store's writer thread but not its change counter: they
    change no Matrix session, so the sessions every process keeps stay good. `ended` reads
    the read connection."""

    async def _transaction(self, work: Callable[[sqlite3.Connection], T]) -> T:
        return await self.db.write(self.db.transaction(work))

    async def _read(self, work: Callable[[sqlite3.Connection], T]) -> T:
        return await self.db.write(lambda: work(self.db.conn()))

    async def open(self, session: BrowserSession) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM page_sessions WHERE expires <= ?", (int(time.time()),))
            conn.execute(
                f"INSERT INTO page_sessions ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (session.id, session.user, session.created, session.expires, session.ip, session.user_agent,
                 session.second_factor),
            )

        await self._transaction(work)

    async def list_open(self, user: str) -> list[BrowserSession]:
        rows = await self._read(
            lambda conn: conn.execute(
                f"SELECT {_COLUMNS} FROM page_sessions WHERE user = ? AND expires > ? ORDER BY created, id",
                (user, int(time.time())),
            ).fetchall()
        )
        return [BrowserSession(*row) for row in rows]

    async def end(self, user: str, session_id: str) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "DELETE FROM page_sessions WHERE id = ? AND user = ? RETURNING expires", (session_id, user)
            )
            return any(expires > time.time() for (expires,) in cursor.fetchall())

        return await self._transaction(work)

    async def ended(self, user: str, session_id: str) -> bool:
        # Asked on every page request: a peek on the loop's read connection, as the rate
        # peek, so it never waits behind a write (in WAL mode a reader never waits for one).
        row = self.db.read(
            "SELECT 1 FROM page_sessions WHERE id = ? AND user = ? AND expires > ?",
            (session_id, user, int(time.time())),
        )
        return row is None

    async def end_all(self, user: str) -> int:
        def work(conn: sqlite3.Connection) -> int:
            rows = conn.execute("DELETE FROM page_sessions WHERE user = ? RETURNING expires", (user,)).fetchall()
            now = time.time()
            return sum(1 for (expires,) in rows if expires > now)

        return await self._transaction(work)
