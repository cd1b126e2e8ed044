"""The device authorizations of the OAuth store (RFC 8628) in the SQLite session file: a mixin of
SqliteOAuthStore (backends.sessions.sqlite.oauth), on its writer thread and transactions.

One row per authorization (table oauth_device_codes, schema.py's migration 6), keyed by the
digest of its device code, with the digest of its user code unique among them; expired rows
are deleted as new ones come.
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

COLUMNS = "device_hash, record, state, decision"


def _now_ms() -> int:
    return int(time.time() * 1000)


def _row(row: tuple[Any, ...] | None, too_soon: bool = False) -> DeviceAuthorization | None:
    if row is None:
        return None
    return DeviceAuthorization(str(row[0]), json.loads(row[1]), str(row[2]), json.loads(row[3]), too_soon)


class SqliteDeviceCodes(SqlitePart):
    """The device-code methods of the OAuth store; `_run` is the store's write transaction."""

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:  # the store's own
        raise NotImplementedError

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

        return await self._run(work)

    async def device_code_by_user_code(self, user_code_hash: str) -> DeviceAuthorization | None:
        def work(conn: sqlite3.Connection) -> DeviceAuthorization | None:
            row = conn.execute(
                f"SELECT {COLUMNS} FROM oauth_device_codes WHERE user_code_hash = ? AND expires_ts >= ?",
                (user_code_hash, _now_ms()),
            ).fetchone()
            return _row(row)

        return await self._run(work)

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

        return await self._run(work)

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

        return await self._run(work)
