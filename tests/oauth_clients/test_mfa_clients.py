"""Real clients signing in with a second factor (`[mfa]`, issue 38), on `run.py` with OAuth on:

- the person adds an authenticator app in headless Chromium (JavaScript off) on the account
  page's security page, reading the `otpauth://` link the page shows; their codes come from
  pyotp (tests/support/second_factors.py), each of a time step never typed before;
- matrix-js-sdk 43 signs in through the OAuth page in Chromium, the second step typed there;
- oauth4webapi 3 signs in, the person posting the forms over plain HTTP, a code on the page
  after the password;
- matrix-js-sdk's device grant is approved in Chromium through the same second step;
- a recovery code passes once; a code passes once (a replay is refused); wrong codes are
  limited (the right one refused too, 429) and none is logged.
"""

from __future__ import annotations

from collections.abc import Iterator
from html import unescape
from typing import Any

import pytest

from tests.oauth_clients.conftest import LIFETIME, PASSWORDS
from tests.oauth_clients.flow import FormBrowser, OAuthClient, SignInError, forms_of, pkce
from tests.oauth_clients.node import (
    chromium_person,
    enrol_in_chromium,
    http_person,
    js_sdk_script,
    oauth4webapi_script,
    run_flow,
    script_in,
)
from tests.oauth_clients.test_device_clients import chromium_approver, run_device_flow
from tests.support.helpers import DEFAULT_USERS, record
from tests.support.js_sdk import install_js_sdk
from tests.support.second_factors import App
from tests.support.servers import ServerProcess

KEY = "an operator's key of at least 32 bytes, for tests"
USERS = {**PASSWORDS, "dave": "dovetail", "erin": "eagle"}
MFA = f'[oauth]\nenabled = true\naccess_token_lifetime = {LIFETIME}\n[mfa]\nenabled = true\nkey = "{KEY}"\n'


@pytest.fixture(scope="module")
def mfa_server(tmp_path_factory) -> Iterator[ServerProcess]:
    users = [*DEFAULT_USERS, record("dave", USERS["dave"], "-d"), record("erin", USERS["erin"], "-e")]
    server = ServerProcess(tmp_path_factory.mktemp("mfa"), 1, MFA, users=users)
    yield server
    server.stop()


def base_of(server: ServerProcess) -> str:
    return f"http://localhost:{server.port}"  # a loopback host is named so (the issuer, the cookies)


@pytest.fixture(scope="module")
def enrolled(mfa_server: ServerProcess, driver) -> dict[str, tuple[App, list[str]]]:
    """alice, bob and dave each with an app added in Chromium (and their recovery codes)."""
    pages: list[str] = []
    found = {user: enrol_in_chromium(driver, base_of(mfa_server), user, USERS[user], pages) for user in ("alice", "bob", "dave")}
    found["pages"] = pages  # type: ignore[assignment]
    return found


def code_of(enrolled: dict[str, Any]) -> Any:
    return lambda user: enrolled[user][0].code()


def test_an_authenticator_app_is_added_in_chromium(enrolled, mfa_server: ServerProcess) -> None:
    pages = enrolled["pages"]
    assert any("Authenticator app added" in page for page in pages), pages
    app, codes = enrolled["alice"]
    assert len(set(codes)) == 10 and len(app.secret) == 32
    # The person's password alone no longer logs in (403, "sign in through the browser").
    status, body = mfa_server.request("/_matrix/client/v3/login", {
        "type": "m.login.password", "identifier": {"type": "m.id.user", "user": "alice"}, "password": "wonderland"})
    assert status == 403 and body["errcode"] == "M_FORBIDDEN" and "browser" in body["error"], body


def test_matrix_js_sdk_signs_in_through_the_second_step_in_chromium(enrolled, mfa_server, driver) -> None:
    node, script = js_sdk_script()
    pages: list[str] = []
    person = chromium_person(driver, lambda user: USERS[user], pages, code_of(enrolled))
    out = run_flow(node, script, ["flow", base_of(mfa_server), "bob", str(LIFETIME)], person)
    assert "failed" not in out, out
    assert out["whoami"] == ["@bob:localhost", out["device_id"]]
    assert out["refresh_calls"] == 1 and out["whoami_after_expiry"] == ["@bob:localhost", out["device_id"]]
    assert any("Second step" in page for page in pages), pages
    assert out["after_logout"] == [401, "M_UNKNOWN_TOKEN"]


def test_oauth4webapi_signs_in_with_a_code_posted_over_http(enrolled, mfa_server) -> None:
    node, script = oauth4webapi_script()
    out = run_flow(node, script, [base_of(mfa_server), "alice"], http_person(lambda user: USERS[user], code_of(enrolled)))
    assert "failed" not in out, out
    assert out["whoami"] == [200, "@alice:localhost", out["device_id"]]
    assert out["refresh"]["rotated"] is True and out["revoked"] is True


def test_matrix_js_sdk_device_grant_is_approved_through_the_second_step(enrolled, mfa_server, driver) -> None:
    node, cache = install_js_sdk()
    script = script_in(cache, "oauth_device_js_sdk.mjs")
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    pages: list[str] = []
    out = run_device_flow(node, script, [base_of(mfa_server), "bob"], chromium_approver(driver, pages, code_of(enrolled)))
    assert "failed" not in out, out
    assert out["whoami"] == ["@bob:localhost", out["allowed"]["device_id"]]
    assert out["denied"] == "access_denied"
    assert any("Second step" in page for page in pages), pages


def sign_in_over_http(server: ServerProcess, user: str, code: str) -> str:
    """One OAuth sign-in of `user` with `code` at the second step, a client of its own; the
    URL it lands on. SignInError (with the page) when the second step refuses the code."""
    client = OAuthClient(base_of(server), client_name="second factor test client")
    _, challenge = pkce()
    url = client.authorization_url("MFAHTTP" + user.upper(), "st", challenge)
    return FormBrowser().sign_in(url, user, USERS[user], client.redirect_uri, code=lambda: code)


def test_a_recovery_code_passes_once(enrolled, mfa_server) -> None:
    _, codes = enrolled["dave"]
    assert "code=" in sign_in_over_http(mfa_server, "dave", codes[3])
    with pytest.raises(SignInError, match="403"):
        sign_in_over_http(mfa_server, "dave", codes[3])


def test_a_code_passes_once(enrolled, mfa_server) -> None:
    code = enrolled["alice"][0].code()
    assert "code=" in sign_in_over_http(mfa_server, "alice", code)
    with pytest.raises(SignInError, match="used already"):
        sign_in_over_http(mfa_server, "alice", code)


def test_guessing_codes_is_stopped_and_logged_without_them(mfa_server, driver) -> None:
    pages: list[str] = []
    app, _ = enrol_in_chromium(driver, base_of(mfa_server), "erin", USERS["erin"], pages)
    browser = FormBrowser()
    base = base_of(mfa_server)
    page = browser.fetch(base + "/account/")
    (form,) = [f for f in forms_of(page.body.decode()) if any(k == "password" for k, _, _ in f.fields)]
    fields = {n: v for _, n, v in form.fields if n}
    step = browser.fetch(base + "/account/", {**fields, "name": "erin", "password": USERS["erin"]})
    assert step.status == 303 and "/account/second-step" in step.headers["Location"], step
    page = browser.fetch(base + step.headers["Location"])
    fields = {n: v for _, n, v in forms_of(page.body.decode())[0].fields if n}
    wrong = [app.wrong() for _ in range(5)]
    for guess in wrong:
        assert browser.fetch(base + "/account/second-step", {**fields, "op": "code", "code": guess}).status == 403
    right = browser.fetch(base + "/account/second-step", {**fields, "op": "code", "code": app.code()})
    assert right.status == 429 and "Too many wrong codes" in unescape(right.body.decode()), right
    log = mfa_server.log.read_text()
    assert log.count("second_factor") >= 6, log[-2000:]  # each check an audit line
    assert not any(guess in log for guess in wrong) and app.codes[-1] not in log
