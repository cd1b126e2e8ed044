"""A page cookie alone cannot end every session: "sign out every other session" names a device
the user has (404 otherwise, as signing one out does) and asks for the password, as signing
out everywhere does; under delegation Synapse is never told an empty device list for it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.helpers import assert_error, assert_json
from tests.support.page_client import Browser, assert_page

pytestmark = pytest.mark.usefixtures("io_loop")

WHOAMI = "/_matrix/client/v3/account/whoami"


async def two_devices_and_the_page(login: Any, browser: Browser) -> dict[str, str]:
    tokens = {}
    for device in ("PHONE", "LAPTOP"):
        tokens[device] = (await login("alice", "wonderland", device_id=device))["access_token"]
    assert (await browser.sign_in()).status == 303
    return tokens


async def still_signed_in(fetch: Any, tokens: dict[str, str]) -> None:
    for token in tokens.values():
        assert_json(await fetch(WHOAMI, token=token))


async def test_end_others_without_the_password_ends_nothing(fetch, login):
    browser = Browser(fetch)
    tokens = await two_devices_and_the_page(login, browser)
    body = assert_page(await browser.post({"op": "end_others", "device_id": "LAPTOP"}), 403)
    assert "Wrong password." in body
    body = assert_page(await browser.post({"op": "end_others", "device_id": "LAPTOP", "password": "no"}), 403)
    assert "Wrong password." in body
    await still_signed_in(fetch, tokens)
    # The form on the session's page asks for it.
    body = assert_page(await browser.get({"action": "org.matrix.session_view", "device_id": "LAPTOP"}))
    form = body[body.index('value="end_others"') :]
    assert 'name="password" type="password"' in form[: form.index("</form>")]


async def test_end_others_keeping_a_device_the_user_lacks_is_404(fetch, login):
    browser = Browser(fetch)
    tokens = await two_devices_and_the_page(login, browser)
    for password in ("", "wonderland"):
        resp = await browser.post({"op": "end_others", "device_id": "NOT-MINE", "password": password})
        assert "no session" in assert_page(resp, 404)
    await still_signed_in(fetch, tokens)


async def test_end_others_with_the_password(fetch, login):
    browser = Browser(fetch)
    tokens = await two_devices_and_the_page(login, browser)
    resp = await browser.post({"op": "end_others", "device_id": "LAPTOP", "password": "wonderland"})
    assert resp.status == 303
    assert_error(await fetch(WHOAMI, token=tokens["PHONE"]), 401, "M_UNKNOWN_TOKEN")
    assert_json(await fetch(WHOAMI, token=tokens["LAPTOP"]))


class TestDelegated:
    @pytest.fixture
    def config_overrides(self, synapse):
        return {"delegation": synapse.section()}

    async def test_no_empty_sync_from_a_cookie(self, fetch, login, synapse):
        browser = Browser(fetch)
        logins = [(await login("alice", "wonderland"))["access_token"] for _ in range(2)]
        assert (await browser.sign_in()).status == 303
        devices = set(synapse.devices["alice"])
        assert len(devices) == 2
        for password in ("", "wonderland"):
            resp = await browser.post({"op": "end_others", "device_id": "NOT-MINE", "password": password})
            assert_page(resp, 404)
        resp = await browser.post({"op": "end", "device_id": "NOT-MINE"})
        assert_page(resp, 404)
        assert [body for name, body in synapse.calls if name == "sync_devices" and not body["devices"]] == []
        assert set(synapse.devices["alice"]) == devices
        for token in logins:
            assert_json(await fetch(WHOAMI, token=token))
