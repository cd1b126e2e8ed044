"""`RateBuckets` in the SQLite session file (table rate_limits): shared by the host's processes."""

from __future__ import annotations

import sqlite3
import time

from backends.sessions.buckets import RateBuckets
from backends.sessions.sqlite.file import SqliteFile, SqlitePart

_FULL_AT = "SELECT full_at FROM rate_limits WHERE key = ?"


def _excess(full_at: float | None, now: float, interval: float, capacity: float) -> tuple[float, float]:
    """The GCRA step at `now`: (seconds over the burst, the bucket's new full-again time)."""
    new_full_at = max(full_at if full_at is not None else now, now) + interval
    return new_full_at - now - capacity, new_full_at


class SqliteRateBuckets(SqlitePart, RateBuckets):
    """Buckets on the host's clock (every process of one host shares it), a part of
    SqliteSessionStore. A step that takes is one write transaction (it moves no change
    counter: buckets are no session); a peek is one read on the loop's read connection.
    A bucket full again is forgotten by the file's purge."""

    def __init__(self, db: SqliteFile) -> None:
        super().__init__(db)
        db.on_purge(lambda conn: conn.execute("DELETE FROM rate_limits WHERE full_at < ?", (time.time(),)))

    async def rate_limit(self, key: str, interval: float, capacity: float, *, take: bool = True) -> float:
        if not take:
            row = self.db.read(_FULL_AT, (key,))
            excess, _ = _excess(row[0] if row is not None else None, time.time(), interval, capacity)
            return excess if excess > 1e-9 else 0.0

        def work(conn: sqlite3.Connection) -> float:
            row = conn.execute(_FULL_AT, (key,)).fetchone()
            excess, new_full_at = _excess(row[0] if row is not None else None, time.time(), interval, capacity)
            if excess > 1e-9:
                return excess
            conn.execute(
                "INSERT INTO rate_limits (key, full_at) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET full_at = excluded.full_at",
                (key, new_full_at),
            )
            return 0.0

        return await self.db.write(self.db.transaction(work))
