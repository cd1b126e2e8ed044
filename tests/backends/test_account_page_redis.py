"""The account page with its sessions on Redis: the sign-out of the page is kept there, so a
copied cookie is refused by every server on that Redis (the page's own tests use SQLite)."""

from __future__ import annotations

import uuid

import pytest

from tests.support.page_client import Browser, assert_page


@pytest.fixture
def config_overrides(redis_url):
    prefix = f"test:{uuid.uuid4().hex}:"
    return {"sessions": {"store": "redis"}, "sessions.redis": {"url": redis_url, "key_prefix": prefix}}


async def test_signed_out_cookie_refused_on_redis(fetch, hs):
    assert hs.sessions.store.name == "redis"
    browser = Browser(fetch)
    assert (await browser.sign_in()).status == 303
    kept = dict(browser.cookies)
    assert "<h1>Your sessions</h1>" in assert_page(await browser.get())
    assert (await browser.post({"op": "sign_out"})).status == 303
    browser.cookies = kept
    assert "<h1>Sign in</h1>" in assert_page(await browser.get())
