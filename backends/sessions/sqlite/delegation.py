"""`DelegationState` in the SQLite session file (tables delegation_users, delegation_resync)."""

from __future__ import annotations

import sqlite3

from backends.sessions.delegation import DelegationState
from backends.sessions.sqlite.file import SqlitePart


class SqliteDelegationState(SqlitePart, DelegationState):
    """What Synapse was told, beside the sessions: a part of SqliteSessionStore."""

    async def provisioned(self, user: str) -> str | None:
        row = await self.db.write(
            lambda: self.db.conn().execute("SELECT digest FROM delegation_users WHERE user = ?", (user,)).fetchone()
        )
        return row[0] if row else None

    async def set_provisioned(self, user: str, digest: str) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO delegation_users (user, digest) VALUES (?, ?) "
                "ON CONFLICT (user) DO UPDATE SET digest = excluded.digest",
                (user, digest),
            )

        await self.db.write(self.db.transaction(work))

    async def mark_resync(self, user: str, mark: int) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO delegation_resync (user, mark) VALUES (?, ?) "
                "ON CONFLICT (user) DO UPDATE SET mark = excluded.mark",
                (user, mark),
            )

        await self.db.write(self.db.transaction(work))

    async def resyncs(self) -> dict[str, int]:
        rows = await self.db.write(
            lambda: self.db.conn().execute("SELECT user, mark FROM delegation_resync").fetchall()
        )
        return {user: mark for user, mark in rows}

    async def clear_resync(self, user: str, mark: int) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute("DELETE FROM delegation_resync WHERE user = ? AND mark = ?", (user, mark))
            return cursor.rowcount > 0

        return await self.db.write(self.db.transaction(work))
