"""The login tokens in the SQLite session store's file (table `login_tokens`), on its writer."""

from __future__ import annotations

import sqlite3
import time

from backends.sessions.login_tokens import LoginTokenRecord, LoginTokenStore
from backends.sessions.sqlite.file import SqliteFile, SqlitePart


class SqliteLoginTokens(SqlitePart, LoginTokenStore):
    """One row per token, deleted when taken; rows past their expiry go with the file's purge
    (and are never taken). Writes go through the writer thread but not the change counter:
    they change no Matrix session."""

    def __init__(self, db: SqliteFile) -> None:
        super().__init__(db)
        db.on_purge(self._purge)

    @staticmethod
    def _purge(conn: sqlite3.Connection) -> None:
        conn.execute("DELETE FROM login_tokens WHERE expires <= ?", (int(time.time()),))

    async def add(self, token_hash: str, record: LoginTokenRecord) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT OR IGNORE INTO login_tokens (token_hash, record, expires) VALUES (?, ?, ?)",
                (token_hash, record.encode(), record.expires),
            )

        await self.db.write(self.db.transaction(work))
        await self.db.purge_now_and_then()

    async def take(self, token_hash: str) -> LoginTokenRecord | None:
        def work(conn: sqlite3.Connection) -> LoginTokenRecord | None:
            row = conn.execute(
                "DELETE FROM login_tokens WHERE token_hash = ? RETURNING record, expires", (token_hash,)
            ).fetchone()
            if row is None or row[1] <= time.time():
                return None
            return LoginTokenRecord.decode(row[0])

        return await self.db.write(self.db.transaction(work))
