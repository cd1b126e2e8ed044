"""Signing out everywhere signs out the account page too: two browsers signed in (two cookie
jars), "sign out everywhere" on the page or POST /logout/all, and neither cookie (nor a copy)
is a sign-in any more; the page lists its own browser sign-ins beside the Matrix sessions.
On SQLite and on a real Redis."""

from __future__ import annotations

import uuid

import pytest

from tests.support.helpers import assert_error, assert_json
from tests.support.page_client import Browser, assert_page

pytestmark = pytest.mark.usefixtures("io_loop", "store_kind")

WHOAMI = "/_matrix/client/v3/account/whoami"


@pytest.fixture(params=["sqlite", "redis"])
def store_kind(request) -> str:
    return request.param


@pytest.fixture
def config_overrides(store_kind, request):
    if store_kind == "sqlite":
        return {}
    url = request.getfixturevalue("redis_url")
    return {"sessions": {"store": "redis"}, "sessions.redis": {"url": url, "key_prefix": f"test:{uuid.uuid4().hex}:"}}


class NamedBrowser(Browser):
    def __init__(self, fetch, agent: str) -> None:
        super().__init__(fetch)
        self.agent = agent

    def _headers(self) -> dict[str, str]:
        return {**super()._headers(), "User-Agent": self.agent}


async def two_browsers(fetch) -> tuple[NamedBrowser, NamedBrowser]:
    home, away = NamedBrowser(fetch, "HomeBrowser/1.0"), NamedBrowser(fetch, "<b>AwayBrowser</b>/2.0")
    for browser in (home, away):
        assert (await browser.sign_in()).status == 303
    return home, away


def signed_out(body: str) -> bool:
    return "<h1>Sign in</h1>" in body


async def test_the_page_lists_its_sign_ins_this_one_marked(fetch, login):
    await login(device_id="PHONE")
    home, away = await two_browsers(fetch)
    body = assert_page(await home.get())
    browsers = body[body.index('id="browsers"') : body.index('id="matrix-sessions"')]
    assert browsers.count("<li") == 2
    assert browsers.count("you are here") == 1 and "Another browser" in browsers
    assert "HomeBrowser/1.0" in browsers and "127.0.0.1" in browsers
    assert "&lt;b&gt;AwayBrowser&lt;/b&gt;/2.0" in browsers and "<b>AwayBrowser" not in browsers  # escaped
    here = browsers[browsers.index('class="card this-browser"') :]
    assert "HomeBrowser/1.0" in here[: here.index("</li>")]
    assert "PHONE" in body[body.index('id="matrix-sessions"') :]
    # Signing one browser out of the page leaves the other listed alone.
    assert (await away.post({"op": "sign_out"})).status == 303
    body = assert_page(await home.get())
    assert body[body.index('id="browsers"') : body.index('id="matrix-sessions"')].count("<li") == 1


async def test_sign_out_everywhere_on_the_page_ends_every_browser(fetch, login):
    token = (await login())["access_token"]
    home, away = await two_browsers(fetch)
    kept = dict(home.cookies)
    resp = await home.post({"op": "end_all", "password": "wonderland"})
    assert resp.status == 303
    assert signed_out(assert_page(await away.get()))
    assert "hs_account" not in away.cookies  # cleared there too
    home.cookies = kept  # a copy of the cookie, replayed
    assert signed_out(assert_page(await home.get()))
    resp = await home.post({"op": "end_all", "password": "wonderland"})
    assert signed_out(assert_page(resp, 401))
    assert_error(await fetch(WHOAMI, token=token), 401, "M_UNKNOWN_TOKEN")


async def test_logout_all_ends_every_browser(fetch, login):
    token = (await login())["access_token"]
    home, away = await two_browsers(fetch)
    bob = Browser(fetch)
    assert (await bob.sign_in("bob", "builder")).status == 303
    assert_json(await fetch("/_matrix/client/v3/logout/all", "POST", token=token))
    for browser in (home, away):
        assert signed_out(assert_page(await browser.get()))
    assert not signed_out(assert_page(await bob.get()))  # another user's page stays


async def test_a_new_sign_in_after_it_stands(fetch, login):
    token = (await login())["access_token"]
    home, _ = await two_browsers(fetch)
    assert_json(await fetch("/_matrix/client/v3/logout/all", "POST", token=token))
    assert (await home.sign_in()).status == 303
    body = assert_page(await home.get())
    assert not signed_out(body)
    assert body[body.index('id="browsers"') : body.index('id="matrix-sessions"')].count("<li") == 1


async def test_the_cli_revoking_all_ends_every_browser(fetch, login, tmp_path, users_path, store_kind, config):
    """`run.py sessions revoke NAME --all`: the account page's sign-ins end with the sessions."""
    import asyncio
    import sys

    from tests.support.helpers import JWT_SECRET
    from tests.support.servers import ROOT

    await login()
    home, away = await two_browsers(fetch)
    if store_kind == "sqlite":
        store = f'[sessions.sqlite]\npath = "{config.resolve_path(config.get("sessions.sqlite", "path"))}"\n'
    else:
        redis = config.section("sessions.redis")
        store = f'[sessions]\nstore = "redis"\n[sessions.redis]\nurl = "{redis["url"]}"\nkey_prefix = "{redis["key_prefix"]}"\n'
    path = tmp_path / "cli.toml"
    path.write_text(f'[auth]\njwt_secret = "{JWT_SECRET}"\n[backend.file]\npath = "{users_path}"\n' + store)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "run.py", "--config", str(path), "sessions", "revoke", "alice", "--all",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert (proc.returncode, out) == (0, b"Ended 1 session of @alice:localhost.\n"), err
    for browser in (home, away):
        assert signed_out(assert_page(await browser.get()))
