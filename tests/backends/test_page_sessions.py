"""The page sessions contract (backends.sessions.browser), the same on SQLite and on a real Redis:
open, list, end one, ask whether one ended, end all of a user's; lifetimes; one user's only."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from backends.base import StoreUnavailable
from backends.sessions import create_session_store
from backends.sessions.base import SessionStore
from backends.sessions.browser import BrowserSession
from tests.backends.test_session_store import store_options


@pytest.fixture(params=["sqlite", "redis"])
def pages(request, tmp_path, io_loop):
    store = create_session_store(request.param, store_options(request.param, tmp_path, request), config_dir=str(tmp_path))
    io_loop.run_sync(store.start)
    yield store.browser_sessions()
    io_loop.run_sync(store.close)


def sign_in(id: str, user: str = "alice", created: int | None = None, lifetime: int = 900, **kw) -> BrowserSession:
    created = created or int(time.time())
    fields = {"ip": "10.0.0.1", "user_agent": "Firefox", **kw}
    return BrowserSession(id, user, created, created + lifetime, fields["ip"], fields["user_agent"])


async def test_open_list_end(pages):
    now = int(time.time())
    first, second = sign_in("n1", created=now - 10, ip="10.0.0.2"), sign_in("n2", created=now, user_agent="Chrome")
    await pages.open(second)
    await pages.open(first)
    await pages.open(sign_in("n3", user="bob"))
    assert await pages.list_open("alice") == [first, second]  # oldest first, every field kept
    assert not await pages.ended("alice", "n1") and not await pages.ended("alice", "n2")
    assert await pages.end("alice", "n1") is True
    assert await pages.end("alice", "n1") is False
    assert await pages.ended("alice", "n1")
    assert await pages.list_open("alice") == [second]


async def test_never_recorded_or_another_users_is_ended(pages):
    await pages.open(sign_in("n1"))
    assert await pages.ended("alice", "never")
    assert await pages.ended("bob", "n1")  # the id is alice's
    assert await pages.end("bob", "n1") is False
    assert not await pages.ended("alice", "n1")


async def test_end_all_of_one_user_only(pages):
    for i in range(3):
        await pages.open(sign_in(f"a{i}"))
    await pages.open(sign_in("b0", user="bob"))
    assert await pages.end_all("alice") == 3
    assert await pages.list_open("alice") == []
    assert all([await pages.ended("alice", f"a{i}") for i in range(3)])
    assert not await pages.ended("bob", "b0")
    assert await pages.end_all("alice") == 0
    await pages.open(sign_in("a9"))  # a new sign-in after it stands
    assert [s.id for s in await pages.list_open("alice")] == ["a9"]


async def test_past_its_lifetime_it_has_ended(pages):
    now = int(time.time())
    await pages.open(sign_in("old", created=now - 1000, lifetime=900))  # expired already
    await pages.open(sign_in("short", created=now, lifetime=1))
    assert await pages.ended("alice", "old")
    assert [s.id for s in await pages.list_open("alice")] == ["short"]
    await asyncio.sleep(2.1)
    assert await pages.ended("alice", "short")
    assert await pages.list_open("alice") == []
    assert await pages.end_all("alice") == 0


async def test_names_and_agents_of_any_text(pages):
    odd = sign_in("n:{x}*", user="al}{ce:\u00e9", user_agent="Mozilla/5.0 (\u2603) \"quoted\"", ip="::1")
    await pages.open(odd)
    assert await pages.list_open(odd.user) == [odd]
    assert not await pages.ended(odd.user, odd.id)
    assert await pages.end_all(odd.user) == 1


def test_an_unknown_store_has_no_page_sessions():
    """The page sign-ins are a door of every store (SessionStore.browser_sessions): a store
    without it is refused when built, not when the page first asks."""

    class Other(SessionStore):
        name = "other"

    with pytest.raises(TypeError, match="browser_sessions"):
        Other()  # type: ignore[abstract]


async def test_a_store_not_started_is_unavailable(tmp_path, request):
    store = create_session_store("sqlite", store_options("sqlite", tmp_path, request), config_dir=str(tmp_path))
    with pytest.raises(StoreUnavailable):
        await store.browser_sessions().ended("alice", "n1")


async def test_sqlite_the_peek_does_not_wait_behind_a_write(tmp_path):
    """Asked on every page request: on the read connection, as the rate peek is, so a write
    under way (a login, a touch, a lock another process holds) never holds a page up."""
    store = create_session_store("sqlite", store_options("sqlite", tmp_path, None), config_dir=str(tmp_path))
    await store.start()
    pages = store.browser_sessions()
    release = threading.Event()
    try:
        await pages.open(sign_in("s1"))
        busy = asyncio.ensure_future(store.db.write(lambda: release.wait(5)))  # the writer thread taken
        assert not await asyncio.wait_for(pages.ended("alice", "s1"), 2.0)
        assert await asyncio.wait_for(pages.ended("alice", "nope"), 2.0)
        release.set()
        await busy
    finally:
        release.set()
        await store.close()


async def test_a_browser_session_keeps_the_second_factor_it_passed(pages):
    passed = BrowserSession("m1", "alice", int(time.time()), int(time.time()) + 900, "10.0.0.1", "Firefox", "totp")
    await pages.open(passed)
    await pages.open(sign_in("m2"))
    assert [s.second_factor for s in await pages.list_open("alice")] == ["totp", ""]
