"""The second factors (backends.sessions.factors) in the SQLite session file: tables
`mfa_factors` (one row per factor, the `Factor` as JSON beside the columns its rules look up)
and `mfa_challenges` (WebAuthn challenges until they expire), born in the migration of
sqlite/schema.py. Every compare-and-set is one write transaction on the store's writer
(BEGIN IMMEDIATE): across every process on the file, of two uses of one code, one wins."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from backends.sessions.factors import RECOVERY, WEBAUTHN, Challenge, Factor, FactorStore
from backends.sessions.sqlite.file import SqliteFile, SqlitePart

T = TypeVar("T")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _credential(factor: Factor) -> bytes | None:
    return factor.credential_id if factor.kind == WEBAUTHN else None


class SqliteFactorStore(SqlitePart, FactorStore):
    """Rows in insertion order (rowid), so a person's factors list oldest first. Writes go
    through the writer thread but not the change counter: they change no Matrix session."""

    def __init__(self, db: SqliteFile) -> None:
        super().__init__(db)
        db.on_purge(self._purge)

    async def _transaction(self, work: Callable[[sqlite3.Connection], T]) -> T:
        return await self.db.write(self.db.transaction(work))

    async def factors(self, user: str) -> list[Factor]:
        rows = await self.db.write(
            lambda: self.db.conn().execute(
                "SELECT record FROM mfa_factors WHERE user = ? ORDER BY rowid", (user,)
            ).fetchall()
        )
        return [Factor.decode(record) for (record,) in rows]

    @staticmethod
    def _one(conn: sqlite3.Connection, user: str, factor_id: str) -> Factor | None:
        row = conn.execute(
            "SELECT record FROM mfa_factors WHERE factor_id = ? AND user = ?", (factor_id, user)
        ).fetchone()
        return Factor.decode(row[0]) if row else None

    async def factor(self, user: str, factor_id: str) -> Factor | None:
        return await self.db.write(lambda: self._one(self.db.conn(), user, factor_id))

    @staticmethod
    def _insert(conn: sqlite3.Connection, factor: Factor) -> None:
        conn.execute(
            "INSERT INTO mfa_factors (factor_id, user, kind, credential_id, record) VALUES (?, ?, ?, ?, ?)",
            (factor.factor_id, factor.user, factor.kind, _credential(factor), factor.encode()),
        )

    async def add_factor(self, factor: Factor) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            try:
                self._insert(conn, factor)
            except sqlite3.IntegrityError:  # the id, or this person's credential id, is taken
                return False
            return True

        return await self._transaction(work)

    async def remove_factor(self, user: str, factor_id: str, *, keep_one: bool = False) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            if keep_one and not conn.execute(
                "SELECT 1 FROM mfa_factors WHERE user = ? AND kind != ? AND factor_id != ?", (user, RECOVERY, factor_id)
            ).fetchone():
                return False  # their last app or passkey
            cursor = conn.execute("DELETE FROM mfa_factors WHERE factor_id = ? AND user = ?", (factor_id, user))
            if cursor.rowcount == 0:
                return False
            if not conn.execute("SELECT 1 FROM mfa_factors WHERE user = ? AND kind != ?", (user, RECOVERY)).fetchone():
                conn.execute("DELETE FROM mfa_factors WHERE user = ?", (user,))  # the codes go with the last
            return True

        return await self._transaction(work)

    async def remove_all(self, user: str) -> int:
        return await self._transaction(
            lambda conn: conn.execute("DELETE FROM mfa_factors WHERE user = ?", (user,)).rowcount
        )

    async def set_recovery_codes(self, factor: Factor) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM mfa_factors WHERE user = ? AND kind = ?", (factor.user, RECOVERY))
            self._insert(conn, factor)

        await self._transaction(work)

    async def add_recovery_codes(self, factor: Factor) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            if conn.execute(
                "SELECT 1 FROM mfa_factors WHERE user = ? AND kind = ?", (factor.user, RECOVERY)
            ).fetchone() or not conn.execute(
                "SELECT 1 FROM mfa_factors WHERE user = ? AND kind != ?", (factor.user, RECOVERY)
            ).fetchone():
                return False  # they have a set, or no app nor passkey
            self._insert(conn, factor)
            return True

        return await self._transaction(work)

    async def _update(self, user: str, factor_id: str, change: Callable[[Factor], Factor | None]) -> bool:
        """Read the factor and write `change(factor)` back in one transaction; False when it is
        gone or `change` says no (None)."""

        def work(conn: sqlite3.Connection) -> bool:
            found = self._one(conn, user, factor_id)
            changed = change(found) if found is not None else None
            if changed is None:
                return False
            conn.execute("UPDATE mfa_factors SET record = ? WHERE factor_id = ?", (changed.encode(), factor_id))
            return True

        return await self._transaction(work)

    async def accept_totp_step(self, user: str, factor_id: str, step: int, now_ms: int) -> bool:
        return await self._update(
            user, factor_id,
            lambda f: replace(f, last_step=step, last_used_ts=now_ms) if step > f.last_step else None,
        )

    async def update_sealed_secret(self, user: str, factor_id: str, sealed_secret: bytes) -> bool:
        return await self._update(user, factor_id, lambda f: replace(f, sealed_secret=sealed_secret))

    async def accept_sign_count(self, user: str, factor_id: str, sign_count: int, now_ms: int) -> bool:
        def grown(f: Factor) -> Factor | None:
            if sign_count > f.sign_count or sign_count == f.sign_count == 0:
                return replace(f, sign_count=sign_count, last_used_ts=now_ms)
            return None

        return await self._update(user, factor_id, grown)

    async def use_recovery_code(self, user: str, code_hash: str, now_ms: int) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            row = conn.execute(
                "SELECT record FROM mfa_factors WHERE user = ? AND kind = ?", (user, RECOVERY)
            ).fetchone()
            found = Factor.decode(row[0]) if row else None
            if found is None or code_hash not in found.code_hashes:
                return False
            kept = tuple(h for h in found.code_hashes if h != code_hash)
            left = replace(found, code_hashes=kept, last_used_ts=now_ms)
            conn.execute("UPDATE mfa_factors SET record = ? WHERE factor_id = ?", (left.encode(), found.factor_id))
            return True

        return await self._transaction(work)

    async def add_challenge(self, challenge: Challenge) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT OR REPLACE INTO mfa_challenges (key, record, expires_ts) VALUES (?, ?, ?)",
                (challenge.key, challenge.encode(), challenge.expires_ts),
            )

        await self._transaction(work)
        await self.db.purge_now_and_then()

    async def take_challenge(self, key: str) -> Challenge | None:
        def work(conn: sqlite3.Connection) -> Challenge | None:
            row = conn.execute(
                "DELETE FROM mfa_challenges WHERE key = ? RETURNING record, expires_ts", (key,)
            ).fetchone()
            if row is None or row[1] <= _now_ms():
                return None
            return Challenge.decode(row[0])

        return await self._transaction(work)

    @staticmethod
    def _purge(conn: sqlite3.Connection) -> None:
        conn.execute("DELETE FROM mfa_challenges WHERE expires_ts < ?", (_now_ms(),))
