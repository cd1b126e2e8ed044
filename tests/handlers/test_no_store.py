"""Every JSON answer says it must not be stored: the login's token first, a person's devices,
profile and errors too; the account page's pages as well (tests/page_client.assert_page)."""

from __future__ import annotations

import pytest

from tests.support.helpers import assert_json
from tests.support.page_client import Browser, assert_page

pytestmark = pytest.mark.usefixtures("io_loop")

NO_STORE = "no-cache, no-store, must-revalidate"
V3 = "/_matrix/client/v3"


def stored_nowhere(resp) -> None:
    assert resp.headers.get("Cache-Control") == NO_STORE, (resp.status, dict(resp.headers))


async def test_the_login_answer_with_its_token(fetch):
    body = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": "alice"}, "password": "wonderland"}
    resp = await fetch(V3 + "/login", "POST", json_body=body)
    assert "access_token" in assert_json(resp)
    stored_nowhere(resp)


async def test_every_json_answer(fetch, login):
    token = (await login(device_id="PHONE"))["access_token"]
    answers = [
        await fetch(V3 + "/account/whoami", token=token),
        await fetch(V3 + "/devices", token=token),
        await fetch(V3 + "/devices/PHONE", token=token),
        await fetch(V3 + "/capabilities", token=token),
        await fetch(V3 + "/profile/@alice:localhost"),
        await fetch(V3 + "/login"),
        await fetch("/_matrix/client/versions"),
        await fetch("/.well-known/matrix/client"),
        await fetch(V3 + "/account/whoami"),  # 401
        await fetch(V3 + "/login", "POST", body=b"{"),  # 400
        await fetch("/nowhere"),  # 404
        await fetch(V3 + "/login", "OPTIONS"),
    ]
    for resp in answers:
        stored_nowhere(resp)
    stored_nowhere(await fetch(V3 + "/logout", "POST", token=token))


async def test_the_account_page_stores_nothing_either(fetch):
    browser = Browser(fetch)
    resp = await browser.sign_in()
    assert resp.headers["Cache-Control"] == "no-store"
    assert_page(await browser.follow(resp))  # checks Cache-Control: no-store
    assert_page(await browser.get({"action": "org.matrix.profile"}))
