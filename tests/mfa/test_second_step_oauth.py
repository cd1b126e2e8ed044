"""The second step on the OAuth and legacy pages (issue 38): the authorization sign-in, the device
approval and MSC3824's sign-in pass through the one second step and come back where they were;
the second factor of the sign-in is carried to the code, the approval or the login token, the
grant and every session they open (refreshes too), and the account page's sessions list shows it."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import pytest

from homeserver.sessions import token_digest
from tests.oauth.conftest import OAuthClient, form_fields, redirect_values
from tests.oauth.device_helpers import DeviceClient
from tests.support.page_client import text
from tests.support.second_factors import App, add_app

KEY = "an operator's key of at least 32 bytes, for tests"
STEP = "/account/second-step"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    return {"mfa": {"enabled": True, "key": KEY}, "oauth": {"enabled": True}}


async def second_step(client: OAuthClient, resp: Any, app: App) -> Any:
    """From a sign-in's redirect to the second step, through it with the app's next code: the
    redirect back."""
    assert resp.status == 303 and resp.headers["Location"].startswith(STEP + "?"), resp
    page = await client.fetch(resp.headers["Location"], headers=client._headers(), follow_redirects=False)
    client._remember(page)
    assert page.status == 200, page
    if "/account/authorize" in resp.headers["Location"]:
        # Its form ends at the client (the OAuth page gives the code at once): CSP's
        # form-action, which holds for every redirect after a form, allows that origin alone.
        assert "form-action 'self' http://127.0.0.1;" in page.headers["Content-Security-Policy"], page.headers
    fields = {**form_fields(text(page)), "op": "code", "code": app.code()}
    back = await client.fetch(STEP, "POST", body=urlencode(fields), headers={**client._headers(), **FORM},
                              follow_redirects=False)
    client._remember(back)
    assert back.status == 303, back
    return back


async def test_the_authorization_sign_in_comes_back_gives_its_code_and_carries_the_factor(hs, fetch):
    app, _ = await add_app(hs.second_factors, "alice")
    client = OAuthClient(fetch)
    params = await client.params("MFADEVICE1", "w" * 43, prompt="login")
    page = await client.authorize_page(params)
    resp = await client.submit(page, op="sign_in", name="alice", password="wonderland")
    back = await second_step(client, resp, app)
    # Back on the request's own page, its password asked once already (prompt=login dropped).
    assert back.headers["Location"].startswith("/account/authorize?") and "prompt" not in back.headers["Location"]
    # Back on the request's page, the sign-in goes on as its form's would: the code, no more pages.
    done = await client.fetch(back.headers["Location"], headers=client._headers(), follow_redirects=False)
    client._remember(done)
    assert done.status == 303 and done.headers["Location"].startswith("http://127.0.0.1/callback?"), done
    code = redirect_values(done.headers["Location"])["code"]
    # That once: the same page again asks for the confirmation.
    again = await client.fetch(back.headers["Location"], headers=client._headers(), follow_redirects=False)
    assert again.status == 200 and 'value="confirm"' in text(again), again
    tokens = (await client.exchange(code, "w" * 43)).json
    session = await hs.sessions.store.get("alice", token_digest(tokens["access_token"]))
    assert session.second_factor == "totp"
    assert (await hs.sessions.store.device("alice", "MFADEVICE1")).second_factor == "totp"
    refreshed = (await client.refresh(tokens["refresh_token"])).json
    again = await hs.sessions.store.get("alice", token_digest(refreshed["access_token"]))
    assert again.second_factor == "totp"


async def test_a_password_sign_in_of_a_person_without_a_factor_carries_none(hs, fetch):
    client = OAuthClient(fetch)
    code, _ = await client.code("PLAINDEV01")
    tokens = (await client.exchange(code)).json
    assert (await hs.sessions.store.get("alice", token_digest(tokens["access_token"]))).second_factor == ""


async def test_the_device_approval_comes_back_to_its_code_and_carries_the_factor(hs, fetch):
    app, _ = await add_app(hs.second_factors, "bob")
    program = DeviceClient(fetch)
    codes = await program.codes("MFADEVICE2")
    person = OAuthClient(fetch)  # a browser: its cookies
    page = await fetch("/account/device?" + urlencode({"user_code": codes["user_code"]}))
    person._remember(page)
    fields = {**form_fields(text(page)), "op": "sign_in", "name": "bob", "password": "builder"}
    resp = await fetch("/account/device", "POST", body=urlencode(fields), headers={**person._headers(), **FORM},
                       follow_redirects=False)
    person._remember(resp)
    back = await second_step(person, resp, app)
    assert back.headers["Location"] == "/account/device?" + urlencode({"user_code": codes["user_code"]})
    confirm = await fetch(back.headers["Location"], headers=person._headers(), follow_redirects=False)
    assert 'value="allow"' in text(confirm), confirm
    fields = {**form_fields(text(confirm)), "op": "allow"}
    allowed = await fetch("/account/device", "POST", body=urlencode(fields), headers={**person._headers(), **FORM})
    assert allowed.status == 200 and "Done" in text(allowed), allowed
    tokens = (await program.poll(codes["device_code"])).json
    assert (await hs.sessions.store.get("bob", token_digest(tokens["access_token"]))).second_factor == "totp"
    # The account page's list says so.
    page = await fetch("/account/", headers=person._headers())
    assert "Authenticator app" in text(page)


async def test_the_legacy_clients_sign_in_comes_back_to_continue_and_its_token_carries_the_factor(hs, fetch):
    """MSC3824's page asks only whether a browser session stands; the second step comes between
    its sign-in and its "continue", and the login token's session says which factor passed."""
    app, _ = await add_app(hs.second_factors, "alice")
    person = OAuthClient(fetch)  # a browser: its cookies
    page_url = "/account/sso?" + urlencode({"redirectUrl": "https://client.example.org/app/"})
    page = await fetch(page_url, headers=person._headers())
    person._remember(page)
    fields = {**form_fields(text(page)), "op": "sign_in", "name": "alice", "password": "wonderland"}
    resp = await fetch(page_url, "POST", body=urlencode(fields), headers={**person._headers(), **FORM},
                       follow_redirects=False)
    person._remember(resp)
    back = await second_step(person, resp, app)
    assert back.headers["Location"] == page_url
    confirm = await fetch(page_url, headers=person._headers())
    assert 'value="continue"' in text(confirm), confirm
    fields = {**form_fields(text(confirm)), "op": "continue"}
    sent = await fetch(page_url, "POST", body=urlencode(fields), headers={**person._headers(), **FORM},
                       follow_redirects=False)
    assert sent.status == 303 and "loginToken=" in sent.headers["Location"], sent
    token = sent.headers["Location"].split("loginToken=")[1].split("&")[0]
    login = await fetch("/_matrix/client/v3/login", "POST", json_body={"type": "m.login.token", "token": token})
    assert login.status == 200, login
    session = await hs.sessions.store.get("alice", token_digest(login.json["access_token"]))
    assert session.second_factor == "totp"
