"""The device authorizations of the OAuth store (RFC 8628) in the SQLite session file: a mixin of
SqliteOAuthStore (backends.sessions.sqlite.oauth), on its writer thread and transactions.

One row per authorization, keyed by the digest of its device code, with the digest of its user
code unique among them; expired rows are deleted as new ones come.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypeVar

from backends.sessions.oauth import APPROVED, PENDING, USED, DeviceAuthorization
from backends.sessions.sqlite.file import SqlitePart

T = TypeVar("T")

DEVICE_SCHEMA = """
CREATE TABLE IF NOT EXISTS oauth_device_codes (
    device_hash    TEXT PRIMARY KEY,  -- SHA-256 of the device code, hex
    user_code_hash TEXT NOT NULL UNIQUE,
    record         TEXT NOT NULL,     -- what the client asked, JSON
    state          TEXT NOT NULL,
    decision       TEXT NOT NULL DEFAULT '{}',
    last_poll_ts   INTEGER NOT NULL DEFAULT 0,
    expires_ts     INTEGER NOT NULL   -- ms: the row goes after it
) WITHOUT ROWID
"""
COLUMNS = "device_hash, record, state, decision"


def _now_ms() -> int:
    return int(time.time() * 1000)


def _row(row: tuple[Any, ...] | None, too_soon: bool = False) -> DeviceAuthorization | None:
    if row is None:
        return None
    return DeviceAuthorization(str(row[0]), json.loads(row[1]), str(row[2]), json.loads(row[3]), too_soon)


class SqliteDeviceCodes(SqlitePart):
    """The device-code methods of the OAuth store; `_run` is the store's write transaction."""

    _device_ready = False

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:  # the store's own
        raise NotImplementedError

    async def _device(self, work: Callable[[sqlite3.Connection], T]) -> T:
        def run(conn: sqlite3.Connection) -> T:
            if not self._device_ready:
                conn.execute(DEVICE_SCHEMA)
                self._device_ready = True
            return work(conn)

        return await self._run(run)

    async def add_device_code(self, device_hash: str, user_code_hash: str, record: dict[str, Any], ttl: float) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            now = _now_ms()
            conn.execute("DELETE FROM oauth_device_codes WHERE expires_ts < ?", (now,))
            cursor = conn.execute(
                "INSERT OR IGNORE INTO oauth_device_codes (device_hash, user_code_hash, record, state, expires_ts) "
                "VALUES (?, ?, ?, ?, ?)",
                (device_hash, user_code_hash, json.dumps(record), PENDING, now + int(ttl * 1000)),
            )
            return cursor.rowcount == 1

        return await self._device(work)

    async def device_code_by_user_code(self, user_code_hash: str) -> DeviceAuthorization | None:
        def work(conn: sqlite3.Connection) -> DeviceAuthorization | None:
            row = conn.execute(
                f"SELECT {COLUMNS} FROM oauth_device_codes WHERE user_code_hash = ? AND expires_ts >= ?",
                (user_code_hash, _now_ms()),
            ).fetchone()
            return _row(row)

        return await self._device(work)

    async def decide_device_code(
        self, device_hash: str, state: str, decision: dict[str, Any], expected: str = PENDING
    ) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "UPDATE oauth_device_codes SET state = ?, decision = ? "
                "WHERE device_hash = ? AND state = ? AND expires_ts >= ?",
                (state, json.dumps(decision), device_hash, expected, _now_ms()),
            )
            return cursor.rowcount == 1

        return await self._device(work)

    async def poll_device_code(self, device_hash: str, now_ms: int, interval_ms: int) -> DeviceAuthorization | None:
        def work(conn: sqlite3.Connection) -> DeviceAuthorization | None:
            row = conn.execute(
                f"SELECT {COLUMNS}, last_poll_ts FROM oauth_device_codes WHERE device_hash = ? AND expires_ts >= ?",
                (device_hash, _now_ms()),
            ).fetchone()
            if row is None:
                return None
            too_soon = bool(row[4]) and now_ms - int(row[4]) < interval_ms
            state = USED if row[2] == APPROVED and not too_soon else row[2]
            conn.execute(
                "UPDATE oauth_device_codes SET last_poll_ts = ?, state = ? WHERE device_hash = ?",
                (now_ms, state, device_hash),
            )
            return _row(row[:4], too_soon)

        return await self._device(work)
