"""The account page over HTTP: security headers and cookies, XSRF, sign-in, every ?action= and every form.

The real-browser walk through the same pages is tests/handlers/test_account_page_browser.py.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import pytest

from tests.support.helpers import DEFAULT_USERS, assert_error, assert_json, record
from tests.support.page_client import CSP, PAGE, Browser, assert_page, set_cookies, text

pytestmark = pytest.mark.usefixtures("io_loop")

WRONG = "Wrong name or password."
DEVICES = "/_matrix/client/v3/devices"
WHOAMI = "/_matrix/client/v3/account/whoami"


async def api_login(login: Any, device_id: str, name: str = "") -> str:
    extra: dict[str, Any] = {"device_id": device_id}
    if name:
        extra["initial_device_display_name"] = name
    return (await login("alice", "wonderland", **extra))["access_token"]


# -- headers, cookies, XSRF ----------------------------------------------------------------


async def test_sign_in_page_headers_and_xsrf_cookie(browser):
    resp = await browser.get()
    body = assert_page(resp)
    assert '<label for="name">' in body and '<label for="password">' in body
    assert 'autocomplete="current-password"' in body
    xsrf = set_cookies(resp)["_xsrf"]
    assert xsrf["httponly"] and xsrf["samesite"] == "Strict" and xsrf["path"] == PAGE
    assert not xsrf["secure"]  # base_url is http here
    assert not xsrf["expires"] and not xsrf["max-age"]  # gone with the browser


async def test_session_cookie_flags(browser):
    resp = await browser.sign_in()
    assert resp.status == 303, resp
    assert resp.headers["Location"] == PAGE + "?action=org.matrix.sessions_list"
    cookie = set_cookies(resp)["hs_account"]
    assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == PAGE
    assert cookie["max-age"] == "900"
    assert not cookie["secure"]
    # The cookie holds no password and no access token: the name, a keyed digest, times.
    assert "wonderland" not in cookie.value


class TestHttpsBaseUrl:
    @pytest.fixture
    def config_overrides(self):
        return {"server": {"base_url": "https://matrix.example.org"}}

    async def test_cookies_are_secure(self, browser):
        resp = await browser.get()
        assert set_cookies(resp)["_xsrf"]["secure"]
        resp = await browser.sign_in()
        assert set_cookies(resp)["hs_account"]["secure"]


async def test_post_without_xsrf_is_refused(browser):
    await browser.get()
    resp = await browser.post({"op": "sign_in", "name": "alice", "password": "wonderland"}, xsrf=False)
    body = assert_page(resp, 403)
    assert "came from another site" in body
    assert "hs_account" not in set_cookies(resp)


async def test_post_with_a_foreign_xsrf_token_is_refused(browser, fetch):
    other = Browser(fetch)
    await other.get()
    await browser.get()
    browser.xsrf = other.xsrf  # a token from another browser's cookie
    resp = await browser.post({"op": "sign_in", "name": "alice", "password": "wonderland"})
    assert_page(resp, 403)
    assert "hs_account" not in set_cookies(resp)


async def test_xsrf_refused_for_signed_in_forms_too(browser, login):
    token = await api_login(login, "PHONE")
    await browser.sign_in()
    resp = await browser.post({"op": "end", "device_id": "PHONE"}, xsrf=False)
    assert_page(resp, 403)
    assert_json(await browser.fetch(WHOAMI, token=token))


async def test_the_api_needs_no_xsrf_and_keeps_json_errors(fetch, login):
    await login()  # POST /login with no cookie at all
    assert_error(await fetch("/_matrix/client/v3/nope"), 404, "M_UNRECOGNIZED")
    assert_error(await fetch("/_matrix/client/v3/login", "PUT"), 405, "M_UNRECOGNIZED")


async def test_unknown_page_path_is_html_404(fetch):
    body = assert_page(await fetch("/account/nope"), 404)
    assert "no such page" in body


async def test_account_without_slash_redirects(fetch):
    resp = await fetch("/account?action=org.matrix.profile", follow_redirects=False)
    assert resp.status == 301
    assert resp.headers["Location"] == "/account/?action=org.matrix.profile"


async def test_stylesheet(fetch):
    resp = await fetch("/account/style.css")
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "text/css; charset=UTF-8"
    assert b":focus-visible" in resp.body


# -- signing in ----------------------------------------------------------------------------


async def test_wrong_password_and_unknown_name_say_the_same(browser):
    first = await browser.sign_in("alice", "not-it")
    second = await browser.sign_in("nobody", "not-it")
    for resp in (first, second):
        body = assert_page(resp, 403)
        assert WRONG in body
        assert "hs_account" not in set_cookies(resp)
    # Same page but for the name typed back into its field (and the fresh XSRF mask).
    strip = re.compile(r'value="[^"]*"')
    assert strip.sub("", text(first)) == strip.sub("", text(second))


async def test_sign_in_by_email_and_by_full_user_id(browser, fetch):
    resp = await browser.sign_in("@alice:localhost", "wonderland")
    assert resp.status == 303, resp


class TestEmail:
    @pytest.fixture
    def user_records(self):
        return [record("carol", "pw-carol", "c", email="Carol@Example.org")]

    async def test_sign_in_by_email(self, browser):
        resp = await browser.sign_in("carol@example.org", "pw-carol")
        assert resp.status == 303, resp
        body = assert_page(await browser.follow(resp))
        assert "@carol:localhost" in body


class TestRateLimit:
    @pytest.fixture
    def config_overrides(self):
        return {"rate_limit": {"address_burst": 2, "address_per_second": 0.01}}

    async def test_the_login_limit_applies(self, browser, fetch):
        assert (await browser.sign_in("alice", "bad")).status == 403
        assert (await browser.sign_in("alice", "bad")).status == 403
        resp = await browser.sign_in("alice", "wonderland")
        body = assert_page(resp, 429)
        assert "Too many attempts" in body
        assert int(resp.headers["Retry-After"]) >= 1
        assert "hs_account" not in set_cookies(resp)
        # It is the API's bucket: POST /login from the same address is refused too.
        body_json = {"identifier": {"type": "m.id.user", "user": "alice"}, "password": "wonderland"}
        assert_error(await fetch("/_matrix/client/v3/login", "POST", json_body=body_json), 429, "M_LIMIT_EXCEEDED")


async def test_no_password_in_any_log_line(browser, caplog):
    caplog.set_level(logging.DEBUG)
    await browser.sign_in("alice", "wonderland")
    await browser.sign_in("alice", "a-wrong-secret")
    for rec in caplog.records:
        line = rec.getMessage()
        assert "wonderland" not in line and "a-wrong-secret" not in line, line


async def test_audit_lines(browser, caplog, fetch, hs):
    """The page's sign-ins (both outcomes), its sign-out and a reset approval are in the audit
    trail as logins are, marked as the page's; never with the password."""
    caplog.set_level(logging.INFO, logger="homeserver.audit")
    await browser.sign_in("alice", "not-it")
    await browser.sign_in("nobody", "not-it")
    await browser.sign_in()
    await browser.post({"op": "sign_out"})
    lines = [r.getMessage() for r in caplog.records if r.name == "homeserver.audit"]
    assert lines == [
        'audit login user="alice" outcome="bad_password" client="127.0.0.1" reason="account page"',
        'audit login user="nobody" outcome="unknown_user" client="127.0.0.1" reason="account page"',
        'audit login user="alice" outcome="success" client="127.0.0.1" reason="account page"',
        'audit logout user="alice" client="127.0.0.1" reason="account page"',
    ]


# -- every ?action= ------------------------------------------------------------------------


@pytest.fixture
def signed_in(browser, login, io_loop) -> dict[str, str]:
    """Two devices logged in through the API, then the browser signed in to the page."""

    async def setup() -> dict[str, str]:
        tokens = {
            "PHONE": await api_login(login, "PHONE", "Alice's phone"),
            "LAPTOP": await api_login(login, "LAPTOP", "<b>laptop</b>"),
        }
        resp = await browser.sign_in()
        assert resp.status == 303, resp
        return tokens

    return io_loop.run_sync(setup)


async def test_signed_out_every_action_shows_the_sign_in_and_keeps_the_action(browser):
    for action in ("org.matrix.sessions_list", "org.matrix.session_view", "org.matrix.cross_signing_reset"):
        body = assert_page(await browser.get({"action": action, "device_id": "PHONE"}))
        assert "<h1>Sign in</h1>" in body
        assert f'name="action" value="{action}"' in body


async def test_sign_in_goes_to_the_action_asked_for(browser, signed_in):
    browser.cookies.pop("hs_account")
    resp = await browser.sign_in(action="org.matrix.session_view", device_id="PHONE")
    assert resp.headers["Location"] == PAGE + "?action=org.matrix.session_view&device_id=PHONE"


async def test_sessions_list(browser, signed_in):
    for query in ({}, {"action": "org.matrix.sessions_list"}, {"action": "org.example.unknown"}, {"action": ""}):
        body = assert_page(await browser.get(query))
        assert "<h1>Your sessions</h1>" in body, query
        assert "PHONE" in body and "LAPTOP" in body and "127.0.0.1" in body
        assert "Alice&#x27;s phone" in body
        assert "&lt;b&gt;laptop&lt;/b&gt;" in body and "<b>laptop" not in body  # escaped
        assert "This browser" in body
        assert "@alice:localhost" in body


async def test_session_view(browser, signed_in):
    body = assert_page(await browser.get({"action": "org.matrix.session_view", "device_id": "PHONE"}))
    assert "Alice&#x27;s phone" in body and "PHONE" in body and 'name="display_name"' in body
    body = assert_page(await browser.get({"action": "org.matrix.session_view", "device_id": "GONE"}), 404)
    assert "no session" in body
    # No device_id: the list.
    assert "<h1>Your sessions</h1>" in assert_page(await browser.get({"action": "org.matrix.session_view"}))


async def test_session_end_asks_first_and_ends_nothing_on_get(browser, signed_in, fetch):
    body = assert_page(await browser.get({"action": "org.matrix.session_end", "device_id": "PHONE"}))
    assert "Sign out a session?" in body and 'value="end"' in body
    assert_json(await fetch(WHOAMI, token=signed_in["PHONE"]))
    assert_page(await browser.get({"action": "org.matrix.session_end", "device_id": "NOPE"}), 404)


async def test_one_card_and_one_sign_out_form_wherever_a_session_is_shown(browser, signed_in):
    """The list, a session's page and the question before signing one out show a session with
    the same facts and the same form (templates/account/_device.html, _end_form.html)."""
    form = re.compile(r'<form method="post" action="/account/" class="inline">.*?</form>', re.S)
    for action in ("org.matrix.sessions_list", "org.matrix.session_view", "org.matrix.session_end"):
        body = assert_page(await browser.get({"action": action, "device_id": "PHONE"}))
        phone = [f for f in form.findall(body) if 'name="device_id" value="PHONE"' in f]
        assert len(phone) == 1, action
        assert 'value="end"' in phone[0]
        assert 'aria-label="Sign out this session: Alice&#x27;s phone">Sign out this session</button>' in phone[0]
        for fact in ("<dt>Session ID</dt><dd><code>PHONE</code></dd>", "<dt>Last address</dt><dd>127.0.0.1</dd>"):
            assert fact in body, (action, fact)


async def test_old_action_names(browser, signed_in):
    body = assert_page(await browser.get({"action": "org.matrix.device_view", "device_id": "PHONE"}))
    assert 'name="display_name"' in body


async def test_profile(browser, signed_in, fetch):
    body = assert_page(await browser.get({"action": "org.matrix.profile"}))
    profile = assert_json(await fetch("/_matrix/client/v3/profile/@alice:localhost"))
    assert profile["displayname"] == "Alice [alice]"
    assert "<dd>Alice [alice]</dd>" in body
    assert profile["avatar_url"] in body
    assert "<input" not in body.split("</header>")[1]  # read only


async def test_cross_signing_reset_without_delegation(browser, signed_in):
    body = assert_page(await browser.get({"action": "org.matrix.cross_signing_reset"}))
    assert "no Synapse behind it" in body
    assert 'value="reset"' not in body


# -- the forms -----------------------------------------------------------------------------


async def test_end_one(browser, signed_in, fetch):
    resp = await browser.post({"op": "end", "device_id": "PHONE"})
    body = assert_page(await browser.follow(resp))
    assert "The session is signed out." in body
    assert "PHONE" not in body and "LAPTOP" in body
    assert_error(await fetch(WHOAMI, token=signed_in["PHONE"]), 401, "M_UNKNOWN_TOKEN")
    assert_json(await fetch(WHOAMI, token=signed_in["LAPTOP"]))


async def test_end_one_already_gone(browser, signed_in, fetch):
    body = assert_page(await browser.post({"op": "end", "device_id": "NOT-MINE"}), 404)
    assert "no session" in body and "PHONE" in body
    assert_json(await fetch(WHOAMI, token=signed_in["PHONE"]))


async def test_rename(browser, signed_in, fetch):
    resp = await browser.post({"op": "rename", "device_id": "LAPTOP", "display_name": "Work laptop"})
    assert resp.headers["Location"].endswith("device_id=LAPTOP")
    assert "The session is renamed." in assert_page(await browser.follow(resp))
    device = assert_json(await fetch(DEVICES + "/LAPTOP", token=signed_in["PHONE"]))
    assert device["display_name"] == "Work laptop"


async def test_rename_too_long_is_a_page_error(browser, signed_in):
    resp = await browser.post({"op": "rename", "device_id": "LAPTOP", "display_name": "x" * 101})
    body = assert_page(resp, 400)
    assert "at most 100 characters" in body


async def test_end_others(browser, signed_in, fetch):
    resp = await browser.post({"op": "end_others", "device_id": "LAPTOP", "password": "wonderland"})
    assert "Every other session is signed out." in assert_page(await browser.follow(resp))
    assert_error(await fetch(WHOAMI, token=signed_in["PHONE"]), 401, "M_UNKNOWN_TOKEN")
    assert_json(await fetch(WHOAMI, token=signed_in["LAPTOP"]))


async def test_end_all_needs_the_password(browser, signed_in, fetch):
    body = assert_page(await browser.post({"op": "end_all", "password": "wrong"}), 403)
    assert "Wrong password." in body
    assert_json(await fetch(WHOAMI, token=signed_in["PHONE"]))
    resp = await browser.post({"op": "end_all", "password": "wonderland"})
    assert set_cookies(resp)["hs_account"].value == ""  # cleared
    for token in signed_in.values():
        assert_error(await fetch(WHOAMI, token=token), 401, "M_UNKNOWN_TOKEN")
    body = assert_page(await browser.follow(resp))
    assert "Every session of your account has ended" in body and "<h1>Sign in</h1>" in body


async def test_end_all_is_one_logout_in_the_audit_trail(browser, signed_in, caplog):
    """Signing out everywhere is one logout (every session and every page sign-in), not that
    and a second one for this browser's own session, which it has ended already."""
    caplog.set_level(logging.INFO, logger="homeserver.audit")
    assert (await browser.post({"op": "end_all", "password": "wonderland"})).status == 303
    lines = [r.getMessage() for r in caplog.records if r.name == "homeserver.audit"]
    assert [line.split(" ")[1] for line in lines] == ["login", "logout"], lines
    assert 'reason="logout_all"' in lines[1]


async def test_sign_out_ends_the_cookie_even_if_kept(browser, signed_in, fetch):
    kept = dict(browser.cookies)
    resp = await browser.post({"op": "sign_out"})
    assert resp.headers["Location"] == PAGE
    assert "hs_account" not in browser.cookies
    browser.cookies = kept  # someone replays the copied cookie
    body = assert_page(await browser.get())
    assert "<h1>Sign in</h1>" in body
    # The Matrix sessions were not touched.
    assert_json(await fetch(WHOAMI, token=signed_in["PHONE"]))


async def test_forms_after_the_browser_session_ended_ask_to_sign_in(browser, signed_in, fetch):
    browser.cookies.pop("hs_account")
    body = assert_page(await browser.post({"op": "end", "device_id": "PHONE"}), 401)
    assert "<h1>Sign in</h1>" in body
    assert_json(await fetch(WHOAMI, token=signed_in["PHONE"]))


async def test_a_forged_cookie_is_ignored(browser, signed_in):
    value = browser.cookies["hs_account"]
    browser.cookies["hs_account"] = value[:-3] + ("aaa" if not value.endswith("aaa") else "bbb")
    assert "<h1>Sign in</h1>" in assert_page(await browser.get())


async def test_unknown_op_is_400(browser, signed_in):
    assert_page(await browser.post({"op": "format_disk"}), 400)


async def test_password_change_ends_the_browser_session(browser, signed_in, users_path, backend):
    users = [dict(r) for r in DEFAULT_USERS]
    users[0] = record("alice", "new-password", " [alice]", display_name="Alice")
    with open(users_path, "w") as fh:
        json.dump({"users": users}, fh)
    await backend.reload()
    resp = await browser.get()
    body = assert_page(resp)
    assert "Your password changed" in body and "<h1>Sign in</h1>" in body
    assert set_cookies(resp)["hs_account"].value == ""  # cleared


async def test_locking_in_the_users_file_ends_the_browser_session(browser, signed_in, users_path, backend, fetch):
    """`run.py lock` (the record's `locked`): the browser session ends at once, sign-in is refused
    with the locked message after the right password only, and the Matrix sessions are kept."""
    users = [dict(r) for r in DEFAULT_USERS]
    users[0]["locked"] = True
    with open(users_path, "w") as fh:
        json.dump({"users": users}, fh)
    await backend.reload()
    resp = await browser.get()
    body = assert_page(resp)
    assert "This account is locked" in body and "<h1>Sign in</h1>" in body
    assert set_cookies(resp)["hs_account"].value == ""
    assert WRONG in assert_page(await browser.sign_in("alice", "wrong"), 403)  # rule 5 answers first
    assert "This account is locked" in assert_page(await browser.sign_in(), 403)
    assert_error(await fetch(WHOAMI, token=signed_in["PHONE"]), 401, "M_USER_LOCKED")
    users[0].pop("locked")
    with open(users_path, "w") as fh:
        json.dump({"users": users}, fh)
    await backend.reload()
    assert_json(await fetch(WHOAMI, token=signed_in["PHONE"]))  # unlocked: the same token works again
    assert (await browser.sign_in()).status == 303


async def test_expired_browser_session(browser, signed_in, monkeypatch):
    import time as time_module

    real = time_module.time
    monkeypatch.setattr("homeserver.account_page.time.time", lambda: real() + 901)
    body = assert_page(await browser.get())
    assert "has ended" in body and "<h1>Sign in</h1>" in body


# -- the cross-signing reset, against an in-process fake Synapse -------------------------


async def test_cross_signing_reset_approved(browser, signed_in, fake_synapse, caplog):
    caplog.set_level(logging.INFO, logger="homeserver.audit")
    body = assert_page(await browser.get({"action": "org.matrix.cross_signing_reset"}))
    assert "10 minutes" in body and 'value="reset"' in body
    body = assert_page(await browser.post({"op": "reset", "password": "wrong"}), 403)
    assert "Wrong password." in body
    assert fake_synapse.received == []
    resp = await browser.post({"op": "reset", "password": "wonderland"})
    assert fake_synapse.received == [("allow_cross_signing_reset", {"localpart": "alice"})]
    assert 'audit cross_signing_reset_allowed user="alice" client="127.0.0.1" reason="account page"' in caplog.messages
    body = assert_page(await browser.follow(resp))
    assert "For the next 10 minutes your Matrix client may reset" in body


async def test_cross_signing_reset_synapse_down(browser, signed_in, fake_synapse):
    fake_synapse.fail = True
    body = assert_page(await browser.post({"op": "reset", "password": "wonderland"}), 502)
    assert "Synapse cannot be reached, try again." in body


def test_served_by_run_py(start):
    """The real server process finds the templates and the stylesheet wherever it is started from."""
    import urllib.request

    server = start()
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/account/", timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Security-Policy"] == CSP
        assert b"<h1>Sign in</h1>" in resp.read()
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/account/style.css", timeout=10) as resp:
        assert resp.headers["Content-Type"] == "text/css; charset=UTF-8"


async def test_cross_signing_reset_for_a_user_synapse_does_not_know(browser, signed_in, fake_synapse):
    fake_synapse.unknown_users.add("alice")
    body = assert_page(await browser.post({"op": "reset", "password": "wonderland"}), 404)
    assert "sign in with a Matrix client first" in body
