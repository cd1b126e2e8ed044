"""A write transaction whose COMMIT fails (SQLite leaves the transaction open after a busy or
full disk answer at COMMIT, and asks the application to roll back) is rolled back: the next
write works, and no other process waits behind a write lock nobody will release."""

from __future__ import annotations

import sqlite3
import time

import pytest

from backends.base import StoreUnavailable
from backends.sessions import Session
from backends.sessions.sqlite import SqliteSessionStore


class CommitFailsOnce:
    """The write connection, whose first COMMIT fails as SQLite's SQLITE_BUSY / SQLITE_FULL
    does: an error, and the transaction still open."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn, self.failed = conn, False

    def execute(self, sql: str, *args):
        if sql == "COMMIT" and not self.failed:
            self.failed = True
            raise sqlite3.OperationalError("database or disk is full")
        return self.conn.execute(sql, *args)

    def __getattr__(self, name: str):
        return getattr(self.conn, name)


def session(token_hash: str) -> Session:
    ts = int(time.time() * 1000)
    return Session(token_hash, "alice", "D1", ts, "10.0.0.1", ts)


@pytest.fixture
def stores(tmp_path, io_loop):
    path = str(tmp_path / "s.db")
    made = [SqliteSessionStore(path, timeout=0.5), SqliteSessionStore(path, timeout=0.5)]
    for store in made:
        io_loop.run_sync(store.start)
    yield made
    for store in made:
        io_loop.run_sync(store.close)


async def test_a_failed_commit_is_rolled_back_and_the_store_writes_again(stores):
    mine, other = stores
    mine.db._write_conn = CommitFailsOnce(mine.db._write_conn)
    with pytest.raises(StoreUnavailable):
        await mine.open(session("h1"), None)
    # Rolled back: nothing of it stays, and the write lock is free for every process.
    await other.open(session("h2"), None)
    await mine.open(session("h3"), None)
    assert await mine.get("alice", "h1") is None
    assert await mine.get("alice", "h2") is not None
    assert await other.get("alice", "h3") is not None
