"""The account page with a real Synapse behind a real nginx (tests/support/delegation_stack.py):
a person who lost their recovery key resets their cross-signing with nothing but their
password, and a lost device signed out in the browser is gone at Synapse too.

A matrix-js-sdk client (the current major, from npm, as in tests/handlers/test_clients.py) uploads
cross-signing keys; Synapse refuses to replace the master key and sends the client to our
page (`m.oauth` in the UIA answer); headless Chromium follows that link, signs in and
approves; the client's new master key is then accepted.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import urllib.parse
from typing import Any

import pytest

from tests.support.browser import chrome, shoot, submitted
from tests.support.delegation_stack import SERVER_NAME, DelegationStack, password_of
from tests.support.js_sdk import install_js_sdk

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Users of this file only (the stack is shared by the whole session).
RESETTER, LOSER = "walter", "trent"
# The current major release of matrix-js-sdk, as tests/handlers/test_clients.py pins it.

UPLOAD = r"""
import * as sdk from "matrix-js-sdk";
const [base, token, userId, key] = process.argv.slice(2);
const client = sdk.createClient({ baseUrl: base, accessToken: token, userId });
const master = { user_id: userId, usage: ["master"], keys: { ["ed25519:" + key]: key } };
try {
  await client.uploadDeviceSigningKeys(undefined, { master_key: master });
  console.log(JSON.stringify({ status: 200 }));
} catch (e) {
  console.log(JSON.stringify({ status: e.httpStatus, errcode: e.errcode ?? null, data: e.data ?? null }));
}
"""


def upload_script(node: str, cache: str) -> tuple[str, str]:
    """node, and a script uploading a master key with matrix-js-sdk, written next to the
    install_js_sdk() cache that gave them."""
    script = os.path.join(cache, "upload_master_key.mjs")
    with open(script, "w") as fh:
        fh.write(UPLOAD)
    return str(node), script


@pytest.fixture(scope="module")
def js_upload() -> tuple[str, str]:
    """node, and a script uploading a master key with matrix-js-sdk (installed into .venv)."""
    return upload_script(*install_js_sdk())


def new_master_key() -> str:
    """An ed25519 public key as Matrix writes it (unpadded base64 of 32 bytes)."""
    return base64.b64encode(os.urandom(32)).decode().rstrip("=")


def upload(js: tuple[str, str], stack: DelegationStack, token: str, user: str, key: str) -> dict[str, Any]:
    node, script = js
    result = subprocess.run([node, script, stack.url, token, f"@{user}:{SERVER_NAME}", key],
                            capture_output=True, text=True, timeout=60, cwd=os.path.dirname(script))
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def master_key_at_synapse(stack: DelegationStack, token: str, user: str) -> list[str]:
    user_id = f"@{user}:{SERVER_NAME}"
    status, body = stack.call("/_matrix/client/v3/keys/query", {"device_keys": {user_id: []}}, token)
    assert status == 200, body
    return sorted(body.get("master_keys", {}).get(user_id, {}).get("keys", {}).values())


def sign_in(driver: Any, user: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    assert driver.find_element(By.TAG_NAME, "h1").text == "Sign in"
    driver.find_element(By.ID, "name").send_keys(user)
    submitted(driver, driver.find_element(By.ID, "password"), password_of(user), Keys.ENTER)


def press(driver: Any, label: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    button = next(b for b in driver.find_elements(By.TAG_NAME, "button") if b.text.strip() == label)
    submitted(driver, button, Keys.ENTER)


def approve_reset(driver: Any, link: str, user: str) -> None:
    """Follow Synapse's `m.oauth` link to our page, sign in and approve the cross-signing
    reset with the password; the page says the client may reset now."""
    from selenium.webdriver.common.by import By

    driver.get(link)
    sign_in(driver, user)
    assert driver.find_element(By.TAG_NAME, "h1").text == "Reset your cross-signing keys"
    driver.find_element(By.ID, "password-reset").send_keys(password_of(user))
    press(driver, "Approve the reset")
    body = driver.find_element(By.TAG_NAME, "body").text
    assert "For the next 10 minutes your Matrix client may reset" in body, body


def test_cross_signing_reset_approved_in_the_browser(synapse_stack: DelegationStack, js_upload) -> None:
    stack = synapse_stack
    token = stack.login(RESETTER)["access_token"]
    # The first cross-signing keys need no approval.
    first = new_master_key()
    assert upload(js_upload, stack, token, RESETTER, first) == {"status": 200}
    assert master_key_at_synapse(stack, token, RESETTER) == [first]

    # Replacing them (the recovery key lost) is refused, pointing at our page.
    second = new_master_key()
    refused = upload(js_upload, stack, token, RESETTER, second)
    assert refused["status"] == 401, refused
    link = refused["data"]["params"]["m.oauth"]["url"]
    assert link == stack.url + "/account/?action=org.matrix.cross_signing_reset", refused
    assert master_key_at_synapse(stack, token, RESETTER) == [first]

    # The person follows the link (through nginx), signs in and approves with their password.
    with chrome() as driver:
        approve_reset(driver, link, RESETTER)
        shoot(driver, "20-synapse-cross-signing-approved")

    # The client's new master key is accepted now.
    assert upload(js_upload, stack, token, RESETTER, second) == {"status": 200}
    assert master_key_at_synapse(stack, token, RESETTER) == [second]


def test_a_lost_device_signed_out_in_the_browser_is_gone_at_synapse(synapse_stack: DelegationStack) -> None:
    from selenium.webdriver.common.by import By

    stack = synapse_stack
    lost = stack.login(LOSER, initial_device_display_name="Lost phone")
    kept = stack.login(LOSER, initial_device_display_name="Laptop")
    assert stack.synapse_devices(LOSER) == sorted([lost["device_id"], kept["device_id"]])

    with chrome() as driver:
        query = urllib.parse.urlencode({"action": "org.matrix.session_end", "device_id": lost["device_id"]})
        driver.get(f"{stack.url}/account/?{query}")
        sign_in(driver, LOSER)
        assert driver.find_element(By.TAG_NAME, "h1").text == "Sign out a session?"
        assert "Lost phone" in driver.find_element(By.TAG_NAME, "main").text
        press(driver, "Sign out this session")
        assert "The session is signed out." in driver.find_element(By.TAG_NAME, "body").text

    # Gone at Synapse before the page answered: the token is refused on the next request.
    status, body = stack.whoami(lost["access_token"])
    assert (status, body["errcode"]) == (401, "M_UNKNOWN_TOKEN"), body
    assert stack.synapse_devices(LOSER) == [kept["device_id"]]
    assert stack.whoami(kept["access_token"])[0] == 200
