"""The account page's sign-ins stand or fall by the sessions' own fingerprints (homeserver.credentials):
`end_on_password_change`, a secret rotation and a replaced account act on them as on every session."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from backends.base import User
from backends.sessions.browser import BrowserSession
from homeserver.account_page import AccountPage, BrowserSessionCookie
from homeserver.credentials import Credentials

pytestmark = pytest.mark.usefixtures("io_loop")

DIRECTORY_USER = User("alice", "a", uid="entry-1", password_stamp="20250101000000Z")


class OneUser:
    """The user store the page asks: one record, replaceable."""

    def __init__(self, user: User) -> None:
        self.user = user

    async def get(self, name: str) -> User | None:
        return self.user if name == self.user.name else None


class Open:
    """Page sessions in memory: every sign-in stands until ended."""

    def __init__(self) -> None:
        self.open_ids: set[str] = set()

    async def open(self, session: BrowserSession) -> None:
        self.open_ids.add(session.id)

    async def ended(self, user: str, session_id: str) -> bool:
        return session_id not in self.open_ids


def account_page(users: Any, credentials: Credentials, store: Any) -> AccountPage:
    login: Any = None  # no sign-in here: the sessions are opened directly
    return AccountPage(
        users=users, browser_sessions=store, login=login, credentials=credentials, delegation=None, server_name="localhost"
    )


async def signed_in(
    credentials: Credentials, user: User = DIRECTORY_USER
) -> tuple[AccountPage, OneUser, BrowserSessionCookie]:
    users = OneUser(user)
    page = account_page(users, credentials, Open())
    session = await page.open(user, "127.0.0.1", "test")
    assert await page.check(session) == (user, None)
    return page, users, session


async def test_a_password_change_ends_the_page_sign_in():
    page, users, session = await signed_in(Credentials("secret"))
    users.user = dataclasses.replace(DIRECTORY_USER, password_stamp="20260101000000Z")
    assert await page.check(session) == (None, "changed")


async def test_end_on_password_change_off_keeps_it_as_it_keeps_sessions():
    page, users, session = await signed_in(Credentials("secret", end_on_password_change=False))
    users.user = dataclasses.replace(DIRECTORY_USER, password_stamp="20260101000000Z")
    assert await page.check(session) == (users.user, None)


async def test_a_replaced_account_ends_it():
    page, users, session = await signed_in(Credentials("secret"))
    users.user = dataclasses.replace(DIRECTORY_USER, uid="entry-2")
    assert await page.check(session) == (None, "gone")


async def test_a_secret_rotation_keeps_it():
    page, _, session = await signed_in(Credentials("old"))
    page.credentials = Credentials("new", ["old"])
    assert await page.check(session) == (DIRECTORY_USER, None)
    page.credentials = Credentials("new")  # the old secret dropped: the sign-in is another credential's
    assert (await page.check(session))[0] is None


async def test_the_cookie_round_trip_and_tampering():
    _, _, session = await signed_in(Credentials("secret"))
    assert BrowserSessionCookie.decode(session.encode()) == session
    assert BrowserSessionCookie.decode('["alice","x","y",1,2]') is None  # a nonce that is not text
    assert BrowserSessionCookie.decode('["alice","x",1,"n"]') is None  # the older four-field cookie
    assert BrowserSessionCookie.decode("not json") is None
