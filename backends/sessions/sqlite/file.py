"""The SQLite session file's plumbing, shared by every part of the store.

One WAL file serves every worker process on a host. Writes run on one thread of their own
(`write`, `transaction`), never on the event loop; short reads that must not wait for a
writer run on the loop, on a read connection of their own (`read`: in WAL mode a reader
never waits for a writer). A write that may end or remove a session moves the change
counter (changes.py), so processes that keep sessions read them again. Every part of the
store is a `SqlitePart` on this one file; each says what its purge forgets (`on_purge`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypeVar

from backends.base import ConfigError, StoreUnavailable
from backends.sessions.sqlite.changes import ChangeCounter
from backends.sessions.sqlite.schema import VERSION, connect, migrate, open_problem, open_retrying

logger = logging.getLogger(__name__)
T = TypeVar("T")
STORE = "session store"
# Expired rows (tombstones, sessions, buckets, OAuth codes and grants) are purged at most
# this often (seconds) per process, after a write that adds rows.
PURGE_EVERY = 600.0


class SqliteFile:
    """The session database: its writer thread and connection, the loop's read connection,
    the change counter. Every method raises StoreUnavailable when the file cannot answer."""

    def __init__(self, path: str, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self._writer: concurrent.futures.ThreadPoolExecutor | None = None
        self._write_conn: sqlite3.Connection | None = None
        self.read_conn: sqlite3.Connection | None = None
        self.changes: ChangeCounter | None = None
        self._purges: list[Callable[[sqlite3.Connection], object]] = []
        # When this process last purged; None: not yet (its first write that adds rows does,
        # however long the machine has been up: monotonic time starts near 0 at boot).
        self._last_purge: float | None = None

    async def start(self) -> None:
        """Open (creating or migrating the schema) on the writer thread, then the read connection."""
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sessions-sqlite")
        try:
            self.changes = ChangeCounter(self.path)
            await self.write(self._open_writer)
            # Opened here, on the loop's thread, and used only there; its reads wait at most
            # 0.2 s for a lock.
            self.read_conn = open_retrying(lambda: connect(self.path, 0.2), self.timeout)
            self.read_conn.execute("PRAGMA query_only=1")
        except (sqlite3.Error, OSError, StoreUnavailable) as exc:
            await self.close()
            raise ConfigError(f"sessions.sqlite.path: {self.path}: {open_problem(self.path, exc)}") from None

    def _open_writer(self) -> None:
        if not os.path.exists(self.path):
            try:
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            except FileExistsError:
                pass  # another worker made it first

        def open_and_migrate() -> sqlite3.Connection:
            conn = connect(self.path, self.timeout)
            try:
                # A file at this version needs nothing (versions only go up): opening it writes
                # nothing, not even the change counter (a command that only reads, a dry run).
                if conn.execute("PRAGMA user_version").fetchone()[0] != VERSION:
                    with self.counter().writing():
                        migrate(conn)
            except BaseException:
                conn.close()
                raise
            return conn

        self._write_conn = open_retrying(open_and_migrate, self.timeout)

    async def close(self) -> None:
        if self.read_conn is not None:
            self.read_conn.close()
            self.read_conn = None
        if self._writer is not None:
            writer, self._writer = self._writer, None
            if self._write_conn is not None:
                conn, self._write_conn = self._write_conn, None
                await asyncio.get_running_loop().run_in_executor(writer, conn.close)
            writer.shutdown(wait=False)
        if self.changes is not None:
            self.changes.close()
            self.changes = None

    def conn(self) -> sqlite3.Connection:
        """The write connection: only inside work given to `write`."""
        if self._write_conn is None:
            raise StoreUnavailable("not started", store=STORE)
        return self._write_conn

    def counter(self) -> ChangeCounter:
        if self.changes is None:
            raise StoreUnavailable("not started", store=STORE)
        return self.changes

    async def write(self, work: Callable[[], T]) -> T:
        """Run `work` on the writer thread; StoreUnavailable when it fails or takes too long."""
        if self._writer is None:
            raise StoreUnavailable("not started", store=STORE)
        future = asyncio.get_running_loop().run_in_executor(self._writer, work)
        try:
            return await asyncio.wait_for(future, self.timeout + 1.0)
        except TimeoutError:
            raise StoreUnavailable(f"{self.path}: timed out", store=STORE) from None
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"{self.path}: {exc}", store=STORE) from None

    def transaction(self, work: Callable[[sqlite3.Connection], T], *, ends: bool = False) -> Callable[[], T]:
        """`work` in a write transaction, for `write`. `ends`: it may end or remove a session,
        so it moves the change counter and every process reads its kept sessions again; other
        writes (a session opened, a last-seen touch, a rate step, delegation marks) change
        nothing a process keeps, as Synapse invalidates only the key it changed."""

        def run() -> T:
            conn = self.conn()
            with self.counter().writing() if ends else contextlib.nullcontext():
                conn.execute("BEGIN IMMEDIATE")
                try:
                    result = work(conn)
                    conn.execute("COMMIT")
                except BaseException:
                    # A failed COMMIT (busy, disk full) may leave the transaction open, its
                    # write lock held against every process: SQLite asks for a ROLLBACK.
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            return result

        return run

    def read(self, sql: str, args: tuple[Any, ...] = ()) -> Any:
        """One row of a short read on the loop's read connection (None when there is none)."""
        if self.read_conn is None:
            raise StoreUnavailable("not started", store=STORE)
        try:
            return self.read_conn.execute(sql, args).fetchone()
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"{self.path}: {exc}", store=STORE) from None

    def on_purge(self, work: Callable[[sqlite3.Connection], object]) -> None:
        """Have the purge run `work` (a part's DELETE of its expired rows) in its transaction."""
        self._purges.append(work)

    async def purge_now_and_then(self) -> None:
        """After a write that added rows: every part's purge in one write transaction, at most
        every PURGE_EVERY s per process. It removes sessions, so it moves the change counter.
        A purge that fails is only logged: the write before it stands, and expired rows are
        never read as live (every read compares their expiry)."""
        if self._last_purge is not None and time.monotonic() - self._last_purge < PURGE_EVERY:
            return
        self._last_purge = time.monotonic()

        def purge(conn: sqlite3.Connection) -> None:
            for work in self._purges:
                work(conn)

        try:
            await self.write(self.transaction(purge, ends=True))
        except StoreUnavailable as exc:
            logger.warning("session store: expired rows not purged (tried again in %.0f s): %s", PURGE_EVERY, exc)


class SqlitePart:
    """What every part of the SQLite store stands on: the session file `db` (its writer,
    transactions, read connection and purge). A part is built with the file, before start."""

    def __init__(self, db: SqliteFile) -> None:
        self.db = db
