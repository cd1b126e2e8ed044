"""POST /login {"type": "m.login.token"} (MSC3824): the login token a browser sign-in handed back
(test_sso.py) opens a session as a password login does (the login response, the device asked
for, the audit line, Synapse told first under delegation); it works once, for at most two
minutes, while its browser sign-in stands and the account is unchanged."""

from __future__ import annotations

import logging
import time
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest

from backends.base import StoreUnavailable
from tests.handlers.test_account_state import edit_users, with_alice
from tests.support.helpers import assert_error, assert_json, hex_hash
from tests.support.openapi import validate
from tests.support.page_client import Browser

LOGIN = "/_matrix/client/v3/login"
WHOAMI = "/_matrix/client/v3/account/whoami"
DEVICES = "/_matrix/client/v3/devices"
PAGE = "/account/sso"
CLIENT = "https://client.example.org/"


@pytest.fixture
def config_overrides():
    return {"mfa": {"enabled": True}}


@pytest.fixture
def browser(fetch) -> Browser:
    return Browser(fetch)


async def login_token(browser: Browser, user: str = "alice", password: str = "wonderland") -> str:
    """The person's browser sign-in, as test_sso.py walks it: the token the client receives."""
    path = PAGE + "?" + urlencode({"redirectUrl": CLIENT})
    await browser.get(path=path)
    if not browser.cookies.get("hs_account"):
        signed = await browser.post({"op": "sign_in", "name": user, "password": password}, path=path)
        assert signed.status == 303, signed
    done = await browser.post({"op": "continue"}, path=path)
    assert done.status == 303, done
    return parse_qs(urlsplit(done.headers["Location"]).query)["loginToken"][0]


def token_body(token: str, **extra: str) -> dict[str, str]:
    return {"type": "m.login.token", "token": token, **extra}


async def test_the_token_answers_the_login_response_once(browser, fetch, caplog):
    caplog.set_level(logging.INFO)
    token = await login_token(browser)
    resp = await fetch(LOGIN, "POST", json_body=token_body(token))
    body = assert_json(resp)
    validate(resp, "login.yaml", "/login", "POST")
    assert set(body) == {"user_id", "access_token", "home_server", "device_id"}
    assert body["user_id"] == "@alice:localhost" and body["home_server"] == "localhost"
    me = assert_json(await fetch(WHOAMI, token=body["access_token"]))
    assert me["user_id"] == "@alice:localhost" and me["device_id"] == body["device_id"]
    # Once: the same token again, an unknown one and an empty one are refused alike (Synapse's answer).
    for again in (token, "not-a-token", ""):
        resp = await fetch(LOGIN, "POST", json_body=token_body(again))
        assert_error(resp, 403, "M_FORBIDDEN", "Invalid login token")
        validate(resp, "login.yaml", "/login", "POST")
    lines = [r.getMessage() for r in caplog.records if r.name == "homeserver.audit"]
    assert 'audit login user="alice" outcome="success" client="127.0.0.1" reason="sso sign-in"' in lines
    assert any(line.startswith('audit login user="alice" outcome="success" device=')
               and line.endswith('reason="login token (browser sign-in)"') for line in lines), lines
    assert sum('outcome="bad_token"' in line for line in lines) == 3
    assert token not in caplog.text


async def test_the_device_and_its_display_name_are_honoured(browser, fetch):
    token = await login_token(browser)
    body = assert_json(await fetch(LOGIN, "POST", json_body=token_body(
        token, device_id="LEGACYPHONE", initial_device_display_name="Cinny on the phone")))
    assert body["device_id"] == "LEGACYPHONE"
    devices = assert_json(await fetch(DEVICES, token=body["access_token"]))["devices"]
    assert [(d["device_id"], d["display_name"]) for d in devices] == [("LEGACYPHONE", "Cinny on the phone")]


async def test_a_token_lives_two_minutes(browser, fetch, hs):
    token = await login_token(browser)
    assert hs.login_tokens.lifetime == 120
    hs.login_tokens.clock = lambda: time.time() + 121
    assert_error(await fetch(LOGIN, "POST", json_body=token_body(token)), 403, "M_FORBIDDEN", "Invalid login token")
    hs.login_tokens.clock = time.time
    assert_error(await fetch(LOGIN, "POST", json_body=token_body(token)), 403, "M_FORBIDDEN")  # used up
    token = await login_token(browser)
    hs.login_tokens.clock = lambda: time.time() + 110
    assert_json(await fetch(LOGIN, "POST", json_body=token_body(token)))


async def test_a_token_whose_browser_sign_in_ended_is_refused(browser, fetch):
    token = await login_token(browser)
    await browser.post({"op": "sign_out"})
    assert_error(await fetch(LOGIN, "POST", json_body=token_body(token)), 403, "M_FORBIDDEN", "Invalid login token")


async def test_a_changed_password_or_a_lock_since_the_sign_in_is_refused(browser, fetch, backend, users_path):
    token = await login_token(browser)
    await edit_users(backend, users_path, with_alice(locked=True))
    assert_error(await fetch(LOGIN, "POST", json_body=token_body(token)), 401, "M_USER_LOCKED")
    await edit_users(backend, users_path, with_alice())
    browser = Browser(browser.fetch)
    token = await login_token(browser)
    await edit_users(backend, users_path, with_alice(password=hex_hash("new password")))
    assert_error(await fetch(LOGIN, "POST", json_body=token_body(token)), 403, "M_FORBIDDEN", "Invalid login token")


@pytest.mark.parametrize(
    ("body", "status", "errcode"),
    [
        ({"type": "m.login.token"}, 400, "M_MISSING_PARAM"),
        ({"type": "m.login.token", "token": 12}, 400, "M_INVALID_PARAM"),
        ({"type": "m.login.token", "token": "x", "device_id": ""}, 400, "M_INVALID_PARAM"),
        ({"type": "m.login.token", "token": "x", "initial_device_display_name": "d" * 101}, 400, "M_INVALID_PARAM"),
    ],
)
async def test_malformed_token_logins(fetch, body, status, errcode):
    assert_error(await fetch(LOGIN, "POST", json_body=body), status, errcode)


@pytest.mark.parametrize("config_overrides", [{}])
async def test_with_mfa_and_oauth_off_a_token_login_is_a_bad_login_type(fetch, config_overrides):
    resp = await fetch(LOGIN, "POST", json_body=token_body("anything"))
    assert_error(resp, 400, "M_UNKNOWN", "Bad login type.")


async def test_a_token_is_given_back_when_the_session_cannot_be_opened(browser, fetch, hs, monkeypatch):
    token = await login_token(browser)
    real_open = hs.sessions.open

    async def away(*args, **kwargs):
        raise StoreUnavailable("down for the test", store="session store")

    monkeypatch.setattr(hs.sessions, "open", away)
    assert_error(await fetch(LOGIN, "POST", json_body=token_body(token)), 503, "M_UNKNOWN")
    monkeypatch.setattr(hs.sessions, "open", real_open)
    assert assert_json(await fetch(LOGIN, "POST", json_body=token_body(token)))["user_id"] == "@alice:localhost"


class TestUnderDelegation:
    """With a (fake) Synapse behind: the user and the device are there before the answer."""

    @pytest.fixture
    def config_overrides(self, synapse):
        return {"delegation": synapse.section(), "oauth": {"enabled": True}}

    async def test_the_device_is_at_synapse_first(self, browser, fetch, synapse):
        token = await login_token(browser)
        body = assert_json(await fetch(LOGIN, "POST", json_body=token_body(token, device_id="LEGACY1")))
        assert body["device_id"] == "LEGACY1"
        assert "provision_user" in synapse.names() and "upsert_device" in synapse.names()
        assert "LEGACY1" in synapse.devices.get("alice", {})

    async def test_synapse_away_keeps_the_token_for_the_retry(self, browser, fetch, synapse):
        token = await login_token(browser)
        synapse.mode = "error"
        assert_error(await fetch(LOGIN, "POST", json_body=token_body(token)), 503, "M_UNKNOWN")
        synapse.mode = "ok"
        assert_json(await fetch(LOGIN, "POST", json_body=token_body(token)))
