"""A client that names one of the person's devices that has a session replaces that session
(issue 34, finding 6): the page says so, with the session's name and when it was last seen,
before anything is allowed, on the sign-in page, after its sign-in form, and on the device
grant's confirmation."""

from __future__ import annotations

import re
from html import unescape

import pytest

from tests.oauth.conftest import redirect_values
from tests.oauth.device_helpers import DeviceClient, Person
from tests.support.helpers import assert_error, assert_json
from tests.support.page_client import text

pytestmark = pytest.mark.usefixtures("io_loop")

WHOAMI = "/_matrix/client/v3/account/whoami"


def flat(page) -> str:
    return " ".join(unescape(text(page)).split())


def replaces(html: str, name: str, device: str) -> bool:
    return "replaces your session" in html and f"<strong>{name}</strong>" in html and device in html


async def test_the_confirmation_names_the_session_it_replaces(client, login):
    await client.login("FIRSTDEVICE")  # signed in on the account page
    await login(device_id="BOBPHONE", initial_device_display_name="Bob's phone")
    page = await client.authorize_page(await client.params("BOBPHONE"))
    html = flat(page)
    assert replaces(html, "Bob's phone", "BOBPHONE") and "last seen" in html
    assert "as a new session" not in html
    first = html.index("<button")
    assert 'value="confirm"' in html[first:html.index(">", first)]
    # A device of no session: a new one, as before.
    assert "as a new session" in flat(await client.authorize_page(await client.params("NEWDEVICE1")))


@pytest.mark.parametrize("prompt", [None, "login"])
async def test_after_the_sign_in_form_a_replacement_is_confirmed_first(client, fetch, login, prompt):
    old = (await login(device_id="BOBPHONE", initial_device_display_name="Bob's phone"))["access_token"]
    params = await client.params("BOBPHONE", prompt=prompt)
    page = await client.authorize_page(params)
    signed_in = await client.submit(page, op="sign_in", name="alice", password="wonderland")
    assert signed_in.status == 200 and "Location" not in signed_in.headers, signed_in
    assert replaces(flat(signed_in), "Bob's phone", "BOBPHONE")
    assert_json(await fetch(WHOAMI, token=old))  # nothing replaced yet
    done = await client.submit(signed_in, op="confirm")
    assert done.status == 303 and redirect_values(done.headers["Location"])["state"] == params["state"]
    tokens = assert_json(await client.exchange(redirect_values(done.headers["Location"])["code"]))
    assert_error(await fetch(WHOAMI, token=old), 401, "M_UNKNOWN_TOKEN")
    assert_json(await fetch(WHOAMI, token=tokens["access_token"]))


async def test_the_device_grant_confirmation_names_the_session_it_replaces(fetch, login, monkeypatch):
    from homeserver.oauth import device

    monkeypatch.setattr(device, "INTERVAL", 0)
    await login(device_id="TVDEVICE01", initial_device_display_name="Living room")
    program, person = DeviceClient(fetch), Person(fetch)
    codes = await program.codes("TVDEVICE01")
    page = await person.open(codes["verification_uri_complete"])
    page = await person.submit(name="alice", password="wonderland")
    html = flat(page)
    assert replaces(html, "Living room", "TVDEVICE01") and "as a new session" not in html
    assert re.findall(r'<button type="submit" name="op" value="([a-z]+)"', html) == ["allow", "deny"]
