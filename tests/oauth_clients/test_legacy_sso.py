"""matrix-js-sdk 43's legacy SSO login (MSC3824: `loginFlows`, `getSsoLoginUrl` with
`action=login`, `loginWithToken` / `login("m.login.token")`) against this server, the person
signing in on our page in headless Chromium (and as a plain HTTP form client): with `[oauth]`
on (the flows say `oauth_aware_preferred`), with `[mfa]` alone, and under delegation with a
real Synapse behind the shipped nginx, where two legacy clients signed in so chat, and a
person with an authenticator app signs in with a code at the second step (pyotp) and chats."""

from __future__ import annotations

import http.server
import json
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.oauth_clients.conftest import PASSWORDS
from tests.oauth_clients.flow import FormBrowser
from tests.oauth_clients.node import ROOT, chromium_person, enrol_in_chromium, http_person, run_flow, script_in
from tests.support.delegation_stack import LOGIN, DelegationStack, password_of, serve
from tests.support.helpers import ci
from tests.support.js_sdk import install_js_sdk
from tests.support.nio_e2e import NioUnavailable, nio_python
from tests.support.servers import ServerProcess

MFA = "[mfa]\nenabled = true\n"
FLOWS = ["m.login.password", "m.login.sso", "m.login.token"]


def sso_script(installed: tuple[str, str]) -> tuple[str, str]:
    """(node, tests/js/sso_js_sdk.mjs beside matrix-js-sdk); called with `install_js_sdk()` in
    each test, which puts the test in the node tier (tests/conftest.py)."""
    node, cache = installed
    return node, script_in(cache, "sso_js_sdk.mjs")


def assert_signed_in(out: dict, user: str) -> None:
    assert "failed" not in out, out
    assert out["flows"] == FLOWS
    assert out["url_action"] == "login"
    assert out["own_query_kept"] is True and out["token_in_query"] is True and out["browser_landed_there"] is True
    assert out["response_keys"] == ["access_token", "device_id", "home_server", "user_id"]
    assert out["whoami"][0] == f"@{user}:localhost" and out["device_matches"] is True
    # The token works once: js-sdk's loginWithToken and login("m.login.token") again are refused.
    assert out["second_use"] == [403, "M_FORBIDDEN"] and out["third_use"] == [403, "M_FORBIDDEN"]


def test_js_sdk_signs_in_through_the_browser_with_oauth_on(oauth_server: ServerProcess, driver) -> None:
    pages: list[str] = []
    node, script = sso_script(install_js_sdk())
    base = f"http://127.0.0.1:{oauth_server.port}"
    out = run_flow(node, script, ["login", base, "alice"], chromium_person(driver, PASSWORDS.__getitem__, pages))
    assert_signed_in(out, "alice")
    assert out["sso"] == {"idps": ["homeserver"], "oauth_aware_preferred": True, "unstable": True}
    assert out["devices"] == [out["whoami"][1]]
    assert out["after_logout"] == [401, "M_UNKNOWN_TOKEN"]
    # The person saw the sign-in, then where the browser would go, before anything was sent.
    assert any("Sign in to continue to 127.0.0.1:" in page for page in pages), pages
    assert any("Continue to 127.0.0.1:" in page and "@alice:localhost" in page for page in pages), pages


def test_signed_in_on_the_account_page_a_web_clients_redirect_goes_straight_to_continue(
    oauth_server: ServerProcess, driver
) -> None:
    """A web client on another site (here 127.0.0.1, the server at localhost) sends the browser
    to the redirect by a link: the page's SameSite=Strict cookie is kept back on that
    cross-site navigation, and the page's own same-site detour brings it, so a person signed
    in on the account page is not asked for the password again."""
    from selenium.webdriver.common.by import By

    server_url = f"http://localhost:{oauth_server.port}"
    client_page = WebClientPage()
    redirect = f"{client_page.url}/cb"
    sign_in_link = server_url + "/_matrix/client/v3/login/sso/redirect?" + urllib.parse.urlencode(
        {"redirectUrl": redirect, "action": "login"})
    client_page.body = f'<!DOCTYPE html><a id="go" href="{sign_in_link}">Sign in</a>'.encode()
    try:
        driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
        driver.get(server_url + "/account/")
        driver.find_element(By.ID, "name").send_keys("alice")
        driver.find_element(By.ID, "password").send_keys(PASSWORDS["alice"])
        driver.find_element(By.CSS_SELECTOR, "main form button[type=submit]").click()
        wait_for(driver, lambda: "Your sessions" in driver.page_source)
        driver.get(client_page.url + "/")
        driver.find_element(By.ID, "go").click()
        wait_for(driver, lambda: "Continue to 127.0.0.1:" in driver.page_source)
        assert 'type="password"' not in driver.page_source
        driver.find_element(By.CSS_SELECTOR, "button[value=continue]").click()
        wait_for(driver, lambda: driver.current_url.startswith(redirect))
        assert "loginToken=" in driver.current_url
    finally:
        client_page.stop()


class WebClientPage:
    """A page of a web client's own site (a plain HTTP server on 127.0.0.1), answering `body`."""

    def __init__(self) -> None:
        self.body = b"<!DOCTYPE html>"
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.end_headers()
                self.wfile.write(owner.body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def wait_for(driver, check, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"at {driver.current_url}:\n{driver.page_source[:2000]}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def mfa_server(tmp_path_factory) -> Iterator[ServerProcess]:
    """`run.py` with `[mfa]` on and `[oauth]` off."""
    server = ServerProcess(tmp_path_factory.mktemp("mfa"), 1, MFA)
    yield server
    server.stop()


def test_js_sdk_with_mfa_alone_and_a_person_without_a_browser(mfa_server: ServerProcess) -> None:
    node, script = sso_script(install_js_sdk())
    base = f"http://127.0.0.1:{mfa_server.port}"
    out = run_flow(node, script, ["login", base, "bob"], http_person(PASSWORDS.__getitem__))
    assert_signed_in(out, "bob")
    # Without OAuth the SSO flow is not "preferred": such clients keep offering the password too.
    assert out["sso"] == {"idps": ["homeserver"], "oauth_aware_preferred": None, "unstable": None}


@pytest.fixture(scope="module")
def nio() -> Path:
    """The Python of the matrix-nio virtualenv (tests/support/nio_e2e.py); skipped with the
    reason when it cannot be had, failed for it when CI is set."""
    try:
        return nio_python()
    except NioUnavailable as exc:
        if ci():
            pytest.fail(f"{exc} (CI is set: the matrix-nio tests must run)")
        pytest.skip(str(exc))


def test_matrix_nio_logs_in_with_the_token_a_browser_brought_back(mfa_server: ServerProcess, nio: Path) -> None:
    """matrix-nio has no SSO helper: a program opens the redirect itself; its `login(token=)`
    and `login_info()` are what it does with the flows."""
    base = f"http://127.0.0.1:{mfa_server.port}"
    redirect = "http://127.0.0.1:9/nio-callback"
    url = base + "/_matrix/client/v3/login/sso/redirect?" + urllib.parse.urlencode({"redirectUrl": redirect})
    landed = FormBrowser().sign_in(url, "alice", PASSWORDS["alice"], redirect)
    token = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(landed).query))["loginToken"]
    done = subprocess.run([str(nio), str(Path(ROOT) / "tests" / "nio" / "token_login.py"), base, token],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["flows"] == FLOWS
    assert out["login"]["user_id"] == "@alice:localhost"
    assert out["whoami"] == [out["login"]["user_id"], out["login"]["device_id"]]
    assert [out["login"]["device_id"], "nio through the browser"] in out["devices"]
    assert out["again"] == ["M_FORBIDDEN", "Invalid login token"]  # nio's status_code is the errcode


class MfaStack(DelegationStack):
    """DelegationStack's parts in its order (ours, Synapse, nginx), `[mfa]` on at ours."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder, MFA)


@pytest.fixture(scope="module")
def mfa_stack(tmp_path_factory) -> Iterator[MfaStack]:
    """Skipped with the reason when Synapse or nginx cannot be had, failed for it under CI."""
    yield from serve(MfaStack, tmp_path_factory.mktemp("sso-synapse-stack"))


def test_two_legacy_clients_sign_in_through_the_browser_and_chat_at_synapse(mfa_stack: MfaStack, driver) -> None:
    node, script = sso_script(install_js_sdk())
    out = run_flow(node, script, ["chat", mfa_stack.url, "carol", "dave"], chromium_person(driver, password_of),
                   timeout=300)
    assert "failed" not in out, (out, mfa_stack.homeserver.log())
    assert out["flows"] == FLOWS
    (carol, carol_device), (dave, dave_device) = out["whoami"]
    assert (carol, dave) == ("@carol:localhost", "@dave:localhost")
    assert out["second_use"] == [[403, "M_FORBIDDEN"], [403, "M_FORBIDDEN"]]
    assert out["first"] == {"body": "hello from a legacy client", "sender": carol}
    assert out["reply"] == {"body": "and back", "sender": dave}
    # Synapse has the devices the token logins opened (provisioned before the login answered).
    assert carol_device in mfa_stack.synapse_devices("carol")
    assert dave_device in mfa_stack.synapse_devices("dave")


def test_a_legacy_client_signs_in_with_a_second_factor_and_chats_at_synapse(mfa_stack: MfaStack, driver) -> None:
    """erin adds an authenticator app on the account page (through nginx), so her password
    alone gets no token; matrix-js-sdk's SSO helpers sign her in through the browser, a code of
    her app at the second step, and she chats at Synapse with frank (who has no second factor,
    and is asked for none)."""
    from selenium.webdriver.common.by import By

    app, _ = enrol_in_chromium(driver, mfa_stack.url, "erin", password_of("erin"), [])
    password_login = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": "erin"},
                      "password": password_of("erin")}
    status, body = mfa_stack.call(LOGIN, password_login)
    assert status == 403 and body["errcode"] == "M_FORBIDDEN" and "browser" in body["error"], body

    asked: list[str] = []

    def code_of(user: str) -> str:
        asked.append(user)
        return app.code()

    pages: list[str] = []
    node, script = sso_script(install_js_sdk())
    # frank signs in first, erin last: her browser session is the one Chromium keeps.
    out = run_flow(node, script, ["chat", mfa_stack.url, "frank", "erin"],
                   chromium_person(driver, password_of, pages, code_of), timeout=300)
    assert "failed" not in out, (out, mfa_stack.homeserver.log())
    assert asked == ["erin"], asked  # the second step asked her, once, and not frank
    assert any("Second step" in page for page in pages), pages
    (frank, _), (erin, erin_device) = out["whoami"]
    assert (frank, erin) == ("@frank:localhost", "@erin:localhost")
    assert out["second_use"] == [[403, "M_FORBIDDEN"], [403, "M_FORBIDDEN"]]
    assert out["first"] == {"body": "hello from a legacy client", "sender": frank}
    assert out["reply"] == {"body": "and back", "sender": erin}
    # Synapse has the device her token login opened, and none from the refused password.
    assert mfa_stack.synapse_devices("erin") == [erin_device]
    assert mfa_stack.our_devices("erin") == [erin_device]

    # Her account page (the browser session the sign-in opened) says which factor it passed.
    driver.get(mfa_stack.url + "/account/")
    shown = driver.find_elements(By.XPATH, f"//li[.//code[text()='{erin_device}']]"
                                           "//dt[text()='Second factor']/following-sibling::dd[1]")
    assert [dd.text for dd in shown] == ["Authenticator app"], driver.find_element(By.TAG_NAME, "body").text
    # And her password is still refused once she has signed in so.
    status, body = mfa_stack.call(LOGIN, password_login)
    assert status == 403 and body["errcode"] == "M_FORBIDDEN", body
