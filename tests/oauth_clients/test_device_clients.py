"""Real clients of the device authorization grant (RFC 8628, v1.18), the person in headless
Chromium typing the code on our page (or opening `verification_uri_complete`):

- matrix-js-sdk 43's `startDeviceAuthorizationGrant` / `waitForDeviceAuthorizationGrant`:
  allowed (tokens, whoami, refresh, revocation), denied (`access_denied`), expired
  (`expired_token`);
- oauth4webapi 3's device requests: a device-only registration, two quick polls
  (`authorization_pending`, `slow_down`), the tokens, the used code (`invalid_grant`), denied.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.oauth_clients.conftest import PASSWORDS
from tests.oauth_clients.node import install_oauth4webapi, run_script, script_in
from tests.support.js_sdk import install_js_sdk
from tests.support.servers import ServerProcess

DEVICE_LIFETIME = 20  # seconds: the least a test waits for an expiry
Approve = Callable[[dict[str, Any]], None]


@pytest.fixture(scope="module")
def device_server(tmp_path_factory) -> Iterator[ServerProcess]:
    server = ServerProcess(
        tmp_path_factory.mktemp("device"), 1, f"[oauth]\nenabled = true\ndevice_code_lifetime = {DEVICE_LIFETIME}\n"
    )
    yield server
    server.stop()


def run_device_flow(node: str, script: str, args: list[str], approve: Approve, timeout: float = 180) -> dict[str, Any]:
    """Run a device flow script; approve (or deny) each code it shows; its result."""

    def answer(message: dict[str, Any]) -> None:
        if "verify" in message:
            approve(message)

    return run_script(node, script, args, answer, timeout)


def chromium_approver(driver: Any, pages: list[str], code_of: Callable[[str], str] | None = None) -> Approve:
    """The person in headless Chromium (JavaScript off), following the contract: a sign-in form
    (one text input, one password input, the first submit button), a code page (one text
    input, the first submit button), a confirmation whose first button allows, second denies."""
    from selenium.webdriver.common.by import By

    def submits(form: Any) -> list[Any]:
        return [b for b in form.find_elements(By.CSS_SELECTOR, "button, input[type=submit]")
                if (b.get_attribute("type") or "submit") == "submit"]

    def click(button: Any) -> None:
        before = driver.page_source
        button.click()
        deadline = time.monotonic() + 30
        while driver.page_source == before and time.monotonic() < deadline:
            time.sleep(0.05)
        pages.append(driver.find_element(By.TAG_NAME, "body").text)

    def approve(message: dict[str, Any]) -> None:
        driver.get(message["verify"])
        pages.append(driver.find_element(By.TAG_NAME, "body").text)
        for _ in range(4):
            form = driver.find_elements(By.TAG_NAME, "form")[-1]
            texts = form.find_elements(By.CSS_SELECTOR, "input[type=text], input[type=email]")
            passwords = form.find_elements(By.CSS_SELECTOR, "input[type=password]")
            if "/account/second-step" in driver.current_url and texts:
                assert code_of is not None and len(texts) == 1, pages[-1]
                texts[0].send_keys(code_of(message["user"]))  # the second step: a current code
                click(submits(form)[0])
            elif passwords:
                assert len(texts) == 1
                texts[0].clear()
                texts[0].send_keys(message["user"])
                passwords[0].send_keys(PASSWORDS[message["user"]])
                click(submits(form)[0])
            elif texts:
                texts[0].send_keys(message["user_code"].lower().replace("-", ""))  # as people type it
                click(submits(form)[0])
            else:
                buttons = submits(form)
                assert len(buttons) == 2, [b.text for b in buttons]
                click(buttons[0 if message["allow"] else 1])
                return
        raise AssertionError(f"no confirmation page: {pages[-1]}")

    return approve


def test_matrix_js_sdk_device_grant_allowed_and_denied(device_server: ServerProcess, driver) -> None:
    node, cache = install_js_sdk()
    script = script_in(cache, "oauth_device_js_sdk.mjs")
    base = f"http://localhost:{device_server.port}"
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    pages: list[str] = []
    out = run_device_flow(node, script, [base, "alice"], chromium_approver(driver, pages))
    assert "failed" not in out, out
    assert out["metadata"]["device_authorization_endpoint"].endswith("/oauth2/device"), out
    assert "urn:ietf:params:oauth:grant-type:device_code" in out["metadata"]["grant_types"]
    session = out["session"]
    assert session["interval"] == 5 and session["expires_in"] == DEVICE_LIFETIME
    assert session["complete"].endswith("?user_code=" + session["user_code"])
    allowed = out["allowed"]
    device = allowed["device_id"]
    assert allowed["error"] is None and allowed["token_type"] == "Bearer" and allowed["refresh"] is True, out
    assert sorted(allowed["scope"].split()) == ["urn:matrix:client:api:*", f"urn:matrix:client:device:{device}"]
    assert out["whoami"] == ["@alice:localhost", device]
    assert out["refreshed"] is True and out["after_revoke"] == [401, "M_UNKNOWN_TOKEN"]
    assert out["denied"] == "access_denied"
    # The page showed the client's name and the device it asked for before the person allowed it.
    confirmation = next(page for page in pages if "Deny" in page)
    assert "matrix-js-sdk device test" in confirmation and device in confirmation, pages


def test_matrix_js_sdk_device_grant_expires(device_server: ServerProcess) -> None:
    node, cache = install_js_sdk()
    script = script_in(cache, "oauth_device_js_sdk.mjs")

    def nobody(message: dict[str, Any]) -> None:
        raise AssertionError(f"nothing to approve here: {message}")

    out = run_device_flow(node, script, [f"http://localhost:{device_server.port}", "alice", "expire"], nobody)
    assert "failed" not in out, out
    assert out["expires_in"] == DEVICE_LIFETIME
    assert out["expired"] == "expired_token" and out["expired_after"] >= DEVICE_LIFETIME - 1, out


def test_oauth4webapi_device_requests(device_server: ServerProcess, driver) -> None:
    node, cache = install_oauth4webapi()
    script = script_in(cache, "oauth_device_oauth4webapi.mjs")
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    pages: list[str] = []
    out = run_device_flow(node, script, [f"http://localhost:{device_server.port}", "bob"], chromium_approver(driver, pages))
    assert "failed" not in out, out
    assert out["advertised"] is True
    assert out["codes"]["interval"] == 5 and len(out["codes"]["user_code"]) == 9
    assert out["quick_polls"] == ["authorization_pending", "slow_down"]
    assert out["token"]["token_type"].lower() == "bearer" and out["token"]["refresh"] is True, out
    assert out["whoami"] == [200, "@bob:localhost", out["device_id"]]
    assert out["refreshed"] is True
    assert out["used_again"] == "invalid_grant"
    assert out["denied"] == "access_denied"
    assert any("oauth4webapi device test" in page and out["device_id"] in page for page in pages), pages
