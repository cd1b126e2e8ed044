"""The OAuth store contract (clients, codes, grants), the same on SQLite and on a real Redis."""

from __future__ import annotations

import asyncio
import time

import pytest

from backends.base import StoreUnavailable
from backends.sessions import Session, create_session_store
from backends.sessions.oauth import CodeRecord, Grant
from tests.backends.test_session_store import store_options


@pytest.fixture(params=["sqlite", "redis"])
def session_store(request, tmp_path, io_loop):
    sessions = create_session_store(request.param, store_options(request.param, tmp_path, request), config_dir=str(tmp_path))
    io_loop.run_sync(sessions.start)
    yield sessions
    io_loop.run_sync(sessions.close)


@pytest.fixture
def oauth_store(session_store):
    return session_store.oauth()


@pytest.fixture
def sqlite_store(request, tmp_path, io_loop):
    """The SQLite session store alone: for what only its rows and change counter show."""
    sessions = create_session_store("sqlite", store_options("sqlite", tmp_path, request), config_dir=str(tmp_path))
    io_loop.run_sync(sessions.start)
    yield sessions
    io_loop.run_sync(sessions.close)


def code(user: str = "alice") -> CodeRecord:
    return CodeRecord(
        client_id="c1", client_name="App", redirect_uri="http://127.0.0.1/cb", code_challenge="x" * 43, user=user,
        device_id="D1", scope="s", identity_fp="i", password_fp="p", created_ts=1,
    )


def grant(refresh: str = "r1", previous: str = "", grant_id: str = "g1", device: str = "D1", **kw) -> Grant:
    values = dict(
        grant_id=grant_id, user="alice", device_id=device, client_id="c1", scope="s", refresh_hash=refresh,
        previous_hash=previous, access_hash="a-" + refresh, rotated_ts=1, created_ts=1,
    )
    values.update(kw)
    return Grant(**values)  # type: ignore[arg-type]


async def test_clients_are_kept_and_expire_idle(oauth_store):
    await oauth_store.add_client("c1", {"client_name": "App", "redirect_uris": ["http://localhost/cb"]}, 60)
    assert (await oauth_store.client("c1"))["client_name"] == "App"
    assert await oauth_store.client("c2") is None
    await oauth_store.add_client("short", {}, 0.05)
    await asyncio.sleep(0.15)
    assert await oauth_store.client("short") is None
    await oauth_store.touch_client("c1", 60)
    assert await oauth_store.client("c1") is not None


async def test_a_code_is_taken_once_and_counted_after(oauth_store):
    await oauth_store.add_code("h", code("alice"), 60)
    assert await oauth_store.take_code("h") == (code("alice"), 1)
    assert await oauth_store.take_code("h") == (code("alice"), 2)
    assert await oauth_store.take_code("unknown") is None
    await oauth_store.add_code("gone", code(), 0.05)
    await asyncio.sleep(0.15)
    assert await oauth_store.take_code("gone") is None


async def test_concurrent_takes_see_one_first_use(oauth_store):
    await oauth_store.add_code("race", code(), 60)
    results = await asyncio.gather(*(oauth_store.take_code("race") for _ in range(5)))
    assert sorted(uses for _, uses in results) == [1, 2, 3, 4, 5]


async def test_grant_rotation_is_compare_and_set(oauth_store):
    await oauth_store.add_grant(grant("r1"), 60)
    assert (await oauth_store.grant_by_refresh("r1")).refresh_hash == "r1"
    assert (await oauth_store.device_grant("alice", "D1")).grant_id == "g1"
    assert await oauth_store.device_grant("alice", "D2") is None
    assert await oauth_store.rotate_grant("r1", grant("r2", "r1"), 60) is True
    assert await oauth_store.rotate_grant("r1", grant("r2b", "r1"), 60) is False  # another rotation came first
    for digest in ("r1", "r2"):  # the previous and the current both lead to the grant
        found = await oauth_store.grant_by_refresh(digest)
        assert found is not None and found.refresh_hash == "r2" and found.previous_hash == "r1"
    assert await oauth_store.rotate_grant("r2", grant("r3", "r2"), 60) is True
    retired = await oauth_store.grant_by_refresh("r1")  # rotated away: still found, to see a replay
    assert retired is not None and retired.refresh_hash == "r3"
    assert await oauth_store.grant_by_refresh("r2b") is None


async def test_a_new_grant_replaces_the_devices_and_delete_forgets(oauth_store):
    await oauth_store.add_grant(grant("r1"), 60)
    await oauth_store.add_grant(grant("n1", grant_id="g2"), 60)
    assert await oauth_store.grant_by_refresh("r1") is None
    assert (await oauth_store.device_grant("alice", "D1")).grant_id == "g2"
    await oauth_store.delete_grant(await oauth_store.device_grant("alice", "D1"))
    assert await oauth_store.device_grant("alice", "D1") is None
    assert await oauth_store.grant_by_refresh("n1") is None


async def test_a_client_with_a_grant_outlives_its_idle_time(oauth_store):
    await oauth_store.add_client("c1", {"client_name": "App"}, 0.05)
    await oauth_store.add_grant(grant("r1"), 60)
    await oauth_store.touch_client("c1", 60)  # what each use of a grant does
    await asyncio.sleep(0.15)
    assert await oauth_store.client("c1") is not None



async def test_access_used_reads_the_session_record_afresh(oauth_store, session_store):
    now = int(time.time() * 1000)
    assert await oauth_store.access_used("alice", "a1") is None
    await session_store.open(Session("a1", "alice", "D1", now, "10.0.0.1", now, expires_ts=now + 60_000), None)
    assert await session_store.get("alice", "a1") is not None  # read (and kept, where a store keeps reads)
    assert await oauth_store.access_used("alice", "a1") is False
    assert await oauth_store.access_used("bob", "a1") is None
    await session_store.touch("alice", "a1", "10.0.0.2", now + 5)
    assert await oauth_store.access_used("alice", "a1") is True
    await session_store.open(Session("a2", "alice", "D1", now, "10.0.0.1", now, expires_ts=now + 60_000), None)
    await session_store.end("alice", "a2")
    assert await oauth_store.access_used("alice", "a2") is True
    await session_store.open(Session("old", "alice", "D1", now - 9000, "10.0.0.1", now - 9000, expires_ts=now - 1000), None)
    assert await oauth_store.access_used("alice", "old") is None


def _session(digest: str, device: str = "D1", expires: int | None = 60_000) -> Session:
    now = int(time.time() * 1000)
    return Session(digest, "alice", device, now, "10.0.0.1", now, expires_ts=now + expires if expires else None)


async def test_a_refresh_is_one_step_while_the_grants_session_is_open(oauth_store, session_store):
    from backends.sessions.oauth import ENDED, RACED, REFRESHED

    await session_store.open(_session("gs", expires=None), "App")  # the grant's own session
    await session_store.open(_session("a-r1"), None)
    await oauth_store.add_grant(grant("r1"), 60)
    done = await oauth_store.refresh_grant("r1", grant("r2", "r1"), 60, _session("a-r2"), grant_session="gs")
    assert done == REFRESHED
    assert (await oauth_store.grant_by_refresh("r2")).access_hash == "a-r2"
    assert (await session_store.get("alice", "a-r2")).ended_ts is None  # the new access token's session
    assert (await session_store.get("alice", "a-r1")).ended_ts is None  # the older one lives to its expiry
    # Another rotation came first: nothing changes, nothing is opened.
    assert await oauth_store.refresh_grant("r1", grant("r2b", "r1"), 60, _session("a-r2b"), grant_session="gs") == RACED
    assert await session_store.get("alice", "a-r2b") is None
    # A lost answer retried: the unused access token of the lost answer ends with the rotation.
    retry = grant("r3", "r1", access_hash="a-r3")
    assert await oauth_store.refresh_grant("r2", retry, 60, _session("a-r3"), grant_session="gs", end_access="a-r2",
                                           client_idle=60) == REFRESHED
    assert (await session_store.get("alice", "a-r2")).ended_ts is not None
    assert (await session_store.get("alice", "a-r3")).ended_ts is None
    # The grant's session ended (a logout, a revocation) before the refresh's write: no new
    # session, and the grant is forgotten.
    await session_store.end("alice", "gs")
    assert await oauth_store.refresh_grant("r3", grant("r4", "r3"), 60, _session("a-r4"), grant_session="gs") == ENDED
    session = await session_store.get("alice", "a-r4")
    assert session is None or session.ended_ts is not None
    assert await oauth_store.grant_by_refresh("r3") is None
    assert await oauth_store.device_grant("alice", "D1") is None


async def test_a_refresh_leaves_the_sqlite_change_counter_alone(sqlite_store):
    # Every process rereads its kept sessions when the counter moves: a refresh ends nothing
    # a process may keep, but the lost answer's retry ends an access token (maybe in use).
    session_store, oauth_store = sqlite_store, sqlite_store.oauth()
    counter = session_store.db.counter()
    await session_store.open(_session("gs", expires=None), "App")
    await oauth_store.add_grant(grant("r1"), 60)
    before = counter.value()
    await oauth_store.refresh_grant("r1", grant("r2", "r1"), 60, _session("a-r2"), grant_session="gs",
                                    client_idle=60)
    assert counter.value() == before
    await oauth_store.refresh_grant("r2", grant("r3", "r1"), 60, _session("a-r3"), grant_session="gs",
                                    end_access="a-r2")
    assert counter.value() > before


async def test_a_rotation_caps_only_the_tokens_it_retires(sqlite_store):
    # On SQLite each rotation shortened every earlier refresh token of the grant (a row per
    # refresh before it); the ones it retires are all that change.
    from backends.sessions.oauth import RETIRED_REFRESH_TTL

    session_store, oauth_store = sqlite_store, sqlite_store.oauth()
    await oauth_store.add_grant(grant("r1"), 864000)
    for n in range(2, 6):
        assert await oauth_store.rotate_grant(f"r{n - 1}", grant(f"r{n}", f"r{n - 1}"), 864000)
    rows = dict(await session_store.db.write(
        lambda: session_store.db.conn().execute("SELECT refresh_hash, expires_ts FROM oauth_refresh").fetchall()
    ))
    capped = (time.time() + RETIRED_REFRESH_TTL) * 1000 + 5000
    assert all(rows[f"r{n}"] <= capped for n in (1, 2, 3))  # retired: remembered a day, to see a replay
    assert all(rows[f"r{n}"] > capped for n in (4, 5))  # the previous and the current
    # A lost answer retried with the previous token (r4): the current one (r5) is what retires.
    assert await oauth_store.rotate_grant("r5", grant("r6", "r4"), 864000)
    assert (await oauth_store.grant_by_refresh("r5")).refresh_hash == "r6"
    assert (await oauth_store.grant_by_refresh("r4")).refresh_hash == "r6"


async def test_a_take_is_given_back_only_while_no_other_came(oauth_store):
    # The tokens of a code could not be made for a while (503): the code stands for a retry,
    # unless another use took it meanwhile (then it stays spent).
    await oauth_store.add_code("back", code("alice"), 60)
    assert (await oauth_store.take_code("back"))[1] == 1
    await oauth_store.give_back_code("back", 1)
    assert (await oauth_store.take_code("back"))[1] == 1
    assert (await oauth_store.take_code("back"))[1] == 2
    await oauth_store.give_back_code("back", 1)  # a second use came: nothing given back
    assert (await oauth_store.take_code("back"))[1] == 3
    await oauth_store.give_back_code("unknown", 1)


async def test_a_failed_commit_of_an_oauth_write_is_rolled_back(sqlite_store):
    """A COMMIT that fails (busy, disk full: SQLite leaves the transaction open) is rolled
    back, as every write of the session store's file is: nothing of it stays, and the writer
    (shared with the sessions) is not left holding the write lock."""
    from tests.backends.test_sqlite_changes import CommitFailsOnce

    oauth = sqlite_store.oauth()
    await oauth.add_client("c0", {"client_name": "first"}, 60)  # the tables exist
    sqlite_store.db._write_conn = CommitFailsOnce(sqlite_store.db._write_conn)
    with pytest.raises(StoreUnavailable):
        await oauth.add_client("c1", {"client_name": "lost"}, 60)
    assert not sqlite_store.db._write_conn.in_transaction
    await oauth.add_client("c2", {"client_name": "kept"}, 60)
    await sqlite_store.open(Session("h1", "alice", "D1", 1, "10.0.0.1", 1), None)
    assert await oauth.client("c1") is None
    assert (await oauth.client("c2"))["client_name"] == "kept"


async def test_the_first_use_of_the_newest_access_token_is_kept_with_the_grant(oauth_store):
    # Issue 34, finding 2: whether the newest access token was used outlives its session (which
    # expires with the token), so a replay of the previous refresh token after that is seen.
    await oauth_store.add_grant(grant("r1"), 60)
    assert (await oauth_store.device_grant("alice", "D1")).access_used is False
    assert await oauth_store.mark_access_used("alice", "D1", "a-other") is False  # not the newest
    assert await oauth_store.mark_access_used("bob", "D1", "a-r1") is False
    assert await oauth_store.mark_access_used("alice", "D1", "a-r1") is True
    assert await oauth_store.mark_access_used("alice", "D1", "a-r1") is False  # once
    for found in (await oauth_store.device_grant("alice", "D1"), await oauth_store.grant_by_refresh("r1")):
        assert found is not None and found.access_used is True and found.refresh_hash == "r1"
    # A rotation brings a new access token, not yet used; the old one's use changes nothing now.
    assert await oauth_store.rotate_grant("r1", grant("r2", "r1"), 60) is True
    assert (await oauth_store.grant_by_refresh("r1")).access_used is False
    assert await oauth_store.mark_access_used("alice", "D1", "a-r1") is False
    assert (await oauth_store.grant_by_refresh("r2")).access_used is False
    assert await oauth_store.mark_access_used("alice", "D1", "a-r2") is True
    assert (await oauth_store.grant_by_refresh("r1")).access_used is True


async def test_a_touch_never_shortens_a_clients_life(oauth_store):
    # A sign-in attempt keeps a client an hour (issue 34, finding 4); one kept longer already
    # (a sign-in completed through it) keeps its longer life.
    await oauth_store.add_client("c1", {"client_name": "App"}, 60)
    await oauth_store.touch_client("c1", 0.05)
    await asyncio.sleep(0.15)
    assert await oauth_store.client("c1") is not None
