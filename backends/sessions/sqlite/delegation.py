"""`DelegationState` in the SQLite session file: tables delegation_users, delegation_resync
(migration 2), and the directory sweep's delegation_missing and delegation_sweep (one row:
the lease, when the last sweep started, the guard's reference count)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Collection

from backends.sessions.delegation import DelegationState
from backends.sessions.sqlite.file import SqlitePart


def now_ms() -> int:
    return int(time.time() * 1000)


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

    # -- the directory sweep (read and written on the writer thread, never on the loop) ----

    async def provisioned_all(self) -> dict[str, str]:
        rows = await self.db.write(
            lambda: self.db.conn().execute("SELECT user, digest FROM delegation_users").fetchall()
        )
        return dict(rows)

    async def missing(self) -> dict[str, int]:
        rows = await self.db.write(
            lambda: self.db.conn().execute("SELECT user, since FROM delegation_missing").fetchall()
        )
        return dict(rows)

    async def set_missing(self, since: dict[str, int]) -> None:
        if not since:
            return

        def work(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO delegation_missing (user, since) VALUES (?, ?) ON CONFLICT (user) DO NOTHING",
                list(since.items()),
            )

        await self.db.write(self.db.transaction(work))

    async def clear_missing(self, users: Collection[str]) -> None:
        if not users:
            return

        def work(conn: sqlite3.Connection) -> None:
            conn.executemany("DELETE FROM delegation_missing WHERE user = ?", [(user,) for user in users])

        await self.db.write(self.db.transaction(work))

    async def claim_sweep(self, holder: str, ttl_ms: int, interval_ms: int | None) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            now = now_ms()
            row = conn.execute("SELECT holder, until_ms, started_ms FROM delegation_sweep WHERE id = 1").fetchone()
            if row is not None:
                other, until, started = row
                if other and other != holder and until > now:
                    return False  # another process sweeps
                if interval_ms is not None and started + interval_ms > now:
                    return False  # swept less than an interval ago
            conn.execute(
                "INSERT INTO delegation_sweep (id, holder, until_ms, started_ms) VALUES (1, ?, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET holder = excluded.holder, until_ms = excluded.until_ms, "
                "started_ms = excluded.started_ms",
                (holder, now + ttl_ms, now),
            )
            return True

        return await self.db.write(self.db.transaction(work))

    async def renew_sweep(self, holder: str, ttl_ms: int) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            now = now_ms()
            cursor = conn.execute(
                "UPDATE delegation_sweep SET until_ms = ? WHERE id = 1 AND holder = ? AND until_ms > ?",
                (now + ttl_ms, holder, now),
            )
            return cursor.rowcount > 0

        return await self.db.write(self.db.transaction(work))

    async def release_sweep(self, holder: str) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute("UPDATE delegation_sweep SET holder = '', until_ms = 0 WHERE id = 1 AND holder = ?", (holder,))

        await self.db.write(self.db.transaction(work))

    async def sweep_reference(self) -> int | None:
        row = await self.db.write(
            lambda: self.db.conn().execute("SELECT reference FROM delegation_sweep WHERE id = 1").fetchone()
        )
        return row[0] if row else None

    async def set_sweep_reference(self, count: int) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO delegation_sweep (id, reference) VALUES (1, ?) "
                "ON CONFLICT (id) DO UPDATE SET reference = excluded.reference",
                (count,),
            )

        await self.db.write(self.db.transaction(work))
