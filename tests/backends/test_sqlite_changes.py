"""The SQLite store keeps the sessions it read only while no process has ended a session
since (the change counter, backends/sessions/sqlite/changes.py): an end by any process is
seen by every other at its next read, as if nothing were kept; the production write mix
(logins, last-seen touches, rate steps and peeks) leaves what is kept in place; a COMMIT that fails is rolled back."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time

import pytest

from backends.base import StoreUnavailable
from backends.sessions import Session
from backends.sessions.sqlite import SqliteSessionStore
from backends.sessions.sqlite.changes import _FORMAT, ChangeCounter
from tests.support.servers import ROOT


def session(token_hash: str, user: str = "alice", **kw) -> Session:
    ts = int(time.time() * 1000)
    return Session(token_hash, user, "D1", ts, "10.0.0.1", ts, **kw)


class CountingConnection:
    """The read connection, counting the reads that reach the file."""

    def __init__(self, conn) -> None:
        self.conn, self.reads = conn, 0

    def execute(self, *args):
        self.reads += 1
        return self.conn.execute(*args)

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def two_stores(tmp_path, io_loop):
    """Two stores on one file, as two worker processes have: `a` counts its reads."""
    path = str(tmp_path / "s.db")
    stores = [SqliteSessionStore(path, timeout=1.0), SqliteSessionStore(path, timeout=1.0)]
    for store in stores:
        io_loop.run_sync(store.start)
    stores[0].db.read_conn = CountingConnection(stores[0].db.read_conn)
    yield stores
    for store in stores:
        io_loop.run_sync(store.close)


def test_the_counter_is_odd_while_a_write_runs_and_even_after(tmp_path):
    first, second = ChangeCounter(str(tmp_path / "s.db")), ChangeCounter(str(tmp_path / "s.db"))
    try:
        assert first.value() == 0
        with first.writing():
            assert second.value() == 1  # the other process sees the write under way
        assert second.value() == 2
        with pytest.raises(RuntimeError), second.writing():
            raise RuntimeError("rolled back")
        assert first.value() == 4  # even again: a failed write moves it too
        _FORMAT.pack_into(first._map, 0, 5)  # a writer that died mid-transaction
        with first.writing():
            assert second.value() % 2 == 1
        assert second.value() % 2 == 0 and second.value() > 5
    finally:
        first.close()
        second.close()


async def test_a_kept_session_is_read_again_after_an_end_by_another_process(two_stores):
    a, b = two_stores
    await b.open(session("h1"), None)
    assert (await a.get("alice", "h1")).ended_ts is None
    reads = a.db.read_conn.reads
    assert (await a.get("alice", "h1")).ended_ts is None
    assert a.db.read_conn.reads == reads  # nothing written since: kept
    assert await a.get("bob", "h1") is None  # kept for its own user only

    assert await b.end("alice", "h1") is True  # a logout in the other process
    ended = await a.get("alice", "h1")
    assert ended is not None and ended.ended_ts is not None

    assert await a.get("alice", "h2") is None  # an absence is not kept:
    await b.open(session("h2"), None)  # a login does not move the counter
    assert (await a.get("alice", "h2")).ended_ts is None


async def test_an_expired_session_is_refused_even_when_kept(two_stores, monkeypatch):
    a, b = two_stores
    await b.open(session("h1", expires_ts=int(time.time() * 1000) + 60_000), None)
    assert await a.get("alice", "h1") is not None
    monkeypatch.setattr("backends.sessions.sqlite.store._now_ms", lambda: int(time.time() * 1000) + 120_000)
    assert await a.get("alice", "h1") is None


async def test_while_a_write_seems_under_way_nothing_is_kept(two_stores):
    a, b = two_stores
    await b.open(session("h1"), None)
    _FORMAT.pack_into(a.db.changes._map, 0, a.db.changes.value() + 1)  # odd: a writer died mid-way
    reads = a.db.read_conn.reads
    await a.get("alice", "h1")
    await a.get("alice", "h1")
    assert a.db.read_conn.reads == reads + 2
    await b.end("alice", "h1")  # the next write makes it even again
    assert a.db.changes.value() % 2 == 0
    assert (await a.get("alice", "h1")).ended_ts is not None


async def test_a_logout_in_another_process_is_seen_at_the_next_read(tmp_path):
    """A real second process (the CLI's revoke does this) ends the session this one keeps."""
    path = str(tmp_path / "s.db")
    store = SqliteSessionStore(path, timeout=1.0)
    await store.start()
    try:
        await store.open(session("h1"), None)
        assert (await store.get("alice", "h1")).ended_ts is None
        assert (await store.get("alice", "h1")).ended_ts is None
        script = (
            "import asyncio\n"
            "from backends.sessions.sqlite import SqliteSessionStore\n"
            "async def main():\n"
            f"    s = SqliteSessionStore({path!r}, timeout=1.0)\n"
            "    await s.start()\n"
            "    assert await s.end('alice', 'h1')\n"
            "    await s.close()\n"
            "asyncio.run(main())\n"
        )
        subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True, timeout=60)
        assert (await store.get("alice", "h1")).ended_ts is not None
    finally:
        await store.close()


def test_writers_in_threads_of_one_process_take_turns(tmp_path):
    """fcntl locks do not exclude threads of one process; the counter's own lock does."""
    import threading

    first, second = ChangeCounter(str(tmp_path / "s.db")), ChangeCounter(str(tmp_path / "s.db"))
    inside, release = threading.Event(), threading.Event()
    seen: list[int] = []

    def slow_writer() -> None:
        with first.writing():
            inside.set()
            release.wait(10)

    def other_writer() -> None:
        with second.writing():
            seen.append(second.value())

    try:
        one = threading.Thread(target=slow_writer)
        one.start()
        inside.wait(10)
        two = threading.Thread(target=other_writer)
        two.start()
        two.join(0.3)
        assert two.is_alive() and not seen  # waits for the first writer
        release.set()
        one.join(10)
        two.join(10)
        assert seen == [3] and first.value() == 4  # one after the other: 1, 2, then 3, 4
    finally:
        first.close()
        second.close()


async def test_the_production_write_mix_leaves_kept_sessions_in_place_and_answers_right(two_stores):
    """Between one worker's reads another does what production does beside them: logins,
    last-seen touches, rate-limit steps and peeks. The reads answer right and stay kept; a
    session opened or ended elsewhere is seen at the next read."""
    a, b = two_stores
    await b.open(session("h1"), None)
    assert (await a.get("alice", "h1")).ended_ts is None
    reads = a.db.read_conn.reads

    await b.touch("alice", "h1", "10.9.9.9", 5)
    assert await b.buckets().rate_limit("address:10.0.0.1", 1.0, 2.0) == 0.0
    assert await b.buckets().rate_limit("address:10.0.0.1", 1.0, 2.0) == 0.0
    assert await b.buckets().rate_limit("failed:alice", 1.0, 2.0, take=False) == 0.0
    await b.open(session("h2", user="bob"), None)
    kept = await a.get("alice", "h1")
    assert kept is not None and kept.ended_ts is None and kept.user == "alice"
    assert a.db.read_conn.reads == reads  # none of those moved the counter: still kept

    # Rate steps are the file's in every process: the peek sees the other's two takes.
    assert await a.buckets().rate_limit("address:10.0.0.1", 1.0, 2.0, take=False) > 0
    assert await a.buckets().rate_limit("address:10.0.0.1", 1.0, 2.0) > 0
    # The touch is in the file (devices read it there), and bob's new session is seen.
    assert (await a.device("alice", "D1")).last_seen_ip == "10.9.9.9"
    assert (await a.get("bob", "h2")).ended_ts is None

    await b.end("alice", "h1")  # ended elsewhere: fresh at the next read
    assert (await a.get("alice", "h1")).ended_ts is not None
    await b.end_devices("bob", None)
    assert (await a.get("bob", "h2")).ended_ts is not None


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


async def test_a_failed_commit_is_rolled_back_and_the_store_writes_again(two_stores):
    """A COMMIT that fails (SQLite leaves the transaction open after a busy or full-disk answer
    there, and asks for a ROLLBACK) is rolled back: nothing of it stays, and no process waits
    behind a write lock nobody releases."""
    mine, other = two_stores
    mine.db._write_conn = CommitFailsOnce(mine.db._write_conn)
    with pytest.raises(StoreUnavailable):
        await mine.open(session("h1"), None)
    await other.open(session("h2"), None)
    await mine.open(session("h3"), None)
    assert await mine.get("alice", "h1") is None
    assert await mine.get("alice", "h2") is not None
    assert await other.get("alice", "h3") is not None


async def test_an_end_through_another_name_of_the_file_is_seen(tmp_path):
    """A process that names the database through a symbolic link (a config pointing at
    /var/lib/homeserver/sessions.db, a link to the volume, while a command runs with the
    real path) shares the counter of the file itself, as SQLite shares its journal: an end
    by one is seen by the other at its next read."""
    real = tmp_path / "volume" / "s.db"
    real.parent.mkdir()
    sqlite3.connect(real).close()
    link = tmp_path / "sessions.db"
    link.symlink_to(real)
    a, b = SqliteSessionStore(str(link), timeout=1.0), SqliteSessionStore(str(real), timeout=1.0)
    await a.start()
    await b.start()
    try:
        await b.open(session("h1"), None)
        assert (await a.get("alice", "h1")).ended_ts is None  # read, and kept
        assert await b.end("alice", "h1") is True
        ended = await a.get("alice", "h1")
        assert ended is not None and ended.ended_ts is not None
        assert sorted(p.name for p in tmp_path.iterdir()) == ["sessions.db", "volume"]  # nothing beside the link
    finally:
        await a.close()
        await b.close()
