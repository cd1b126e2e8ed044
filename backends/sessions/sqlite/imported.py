"""`ImportedState` in the SQLite session file (tables synapse_tokens, synapse_deactivated; migration 8):
a batch of a move is one write transaction, its sessions and grants written by the session
store's and the OAuth store's own inserts (`insert_sessions`, `insert_grants`)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator

from backends.sessions.imported import ImportBatch, ImportedState
from backends.sessions.oauth import Grant
from backends.sessions.records import Session
from backends.sessions.sqlite.file import SqliteFile, SqlitePart

# Digests asked in one statement (SQLite's default limit on variables is 32766).
CHUNK = 500


def _chunks(items: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(items), CHUNK):
        yield items[start:start + CHUNK]


class SqliteImportedState(SqlitePart, ImportedState):
    """The move's bookkeeping beside the sessions: a part of SqliteSessionStore."""

    def __init__(
        self,
        db: SqliteFile,
        *,
        insert_sessions: Callable[[sqlite3.Connection, list[tuple[Session, str | None]]], None],
        insert_grants: Callable[[sqlite3.Connection, list[tuple[Grant, float]]], None],
    ) -> None:
        super().__init__(db)
        self._insert_sessions = insert_sessions
        self._insert_grants = insert_grants

    async def add(self, batch: ImportBatch) -> None:
        now = int(time.time() * 1000)

        def work(conn: sqlite3.Connection) -> None:
            self._insert_sessions(conn, batch.sessions)
            self._insert_grants(conn, batch.grants)
            conn.executemany("INSERT OR IGNORE INTO synapse_tokens (token_hash, user) VALUES (?, ?)", batch.tokens)
            conn.executemany(
                "INSERT OR IGNORE INTO synapse_deactivated (user, ts) VALUES (?, ?)",
                [(user, now) for user in batch.deactivated],
            )

        # A new session changes nothing a process keeps (absences are not kept): no counter move.
        await self.db.write(self.db.transaction(work))

    async def undo(self, batch: ImportBatch) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.executemany("DELETE FROM sessions WHERE token_hash = ?", [(s.token_hash,) for s, _ in batch.sessions])
            conn.executemany(
                "DELETE FROM devices WHERE user = ? AND device_id = ? AND NOT EXISTS ("
                "SELECT 1 FROM sessions WHERE user = ? AND device_id = ? AND ended_ts IS NULL)",
                [(s.user, s.device_id, s.user, s.device_id) for s, _ in batch.sessions],
            )
            grants = [(g.grant_id,) for g, _ in batch.grants]
            conn.executemany("DELETE FROM oauth_refresh WHERE grant_id = ?", grants)
            conn.executemany("DELETE FROM oauth_grants WHERE grant_id = ?", grants)
            conn.executemany("DELETE FROM synapse_tokens WHERE token_hash = ?", [(d,) for d, _ in batch.tokens])

        # Sessions go: every process reads its kept ones again.
        await self.db.write(self.db.transaction(work, ends=True))

    async def known_tokens(self, digests: list[str]) -> set[str]:
        def work() -> set[str]:
            found: set[str] = set()
            conn = self.db.conn()
            for chunk in _chunks(digests):
                rows = conn.execute(
                    f"SELECT token_hash FROM synapse_tokens WHERE token_hash IN ({', '.join('?' * len(chunk))})",
                    chunk,
                ).fetchall()
                found.update(row[0] for row in rows)
            return found

        return await self.db.write(work) if digests else set()

    async def token_user(self, token_hash: str) -> str | None:
        row = self.db.read("SELECT user FROM synapse_tokens WHERE token_hash = ?", (token_hash,))
        return str(row[0]) if row is not None else None

    async def is_deactivated(self, user: str) -> bool:
        return self.db.read("SELECT 1 FROM synapse_deactivated WHERE user = ?", (user,)) is not None

    async def deactivated_users(self) -> set[str]:
        rows = await self.db.write(lambda: self.db.conn().execute("SELECT user FROM synapse_deactivated").fetchall())
        return {row[0] for row in rows}
