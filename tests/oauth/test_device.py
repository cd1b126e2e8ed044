"""The device authorization grant (RFC 8628, v1.18) over HTTP: the endpoint, the approval page,
the polls and their answers, the refusals, the limits, and codes never logged."""

from __future__ import annotations

import logging
import re

import pytest

from homeserver.oauth import device
from tests.oauth.conftest import UNSTABLE, scope
from tests.oauth.device_helpers import DEVICE_GRANT, DeviceClient, Person
from tests.support.helpers import assert_json
from tests.support.page_client import text

pytestmark = pytest.mark.usefixtures("io_loop")

WHOAMI = "/_matrix/client/v3/account/whoami"
USER_CODE = re.compile(r"[BCDFGHJKLMNPQRSTVWXZ]{4}-[BCDFGHJKLMNPQRSTVWXZ]{4}")


@pytest.fixture
def client(fetch) -> DeviceClient:
    return DeviceClient(fetch)


@pytest.fixture
def person(fetch) -> Person:
    return Person(fetch)


@pytest.fixture
def quick(monkeypatch):
    """Polls may come at once (the interval is tested on its own)."""
    monkeypatch.setattr(device, "INTERVAL", 0)


async def test_metadata_and_registration_name_the_grant(client, fetch):
    metadata = await client.discover()
    assert metadata["device_authorization_endpoint"].endswith("/oauth2/device")
    assert DEVICE_GRANT in metadata["grant_types_supported"]
    await client.ensure_client()
    # A program without a browser registers for the device grant alone, with no redirect URI.
    body = {"client_name": "CLI", "client_uri": "https://cli.example.org/", "application_type": "native",
            "token_endpoint_auth_method": "none", "grant_types": [DEVICE_GRANT, "refresh_token"]}
    resp = await fetch(client.path("registration_endpoint"), "POST", json_body=body)
    registered = assert_json(resp, 201)
    assert registered["grant_types"] == ["refresh_token", DEVICE_GRANT] and registered["redirect_uris"] == []
    # Neither the code grant nor the device grant: refused as before.
    resp = await client.register(grant_types=["refresh_token"])
    assert resp.status == 400 and resp.json["error"] == "invalid_client_metadata"


async def test_the_whole_flow_from_the_complete_uri(client, person, fetch, quick):
    codes = await client.codes()
    assert USER_CODE.fullmatch(codes["user_code"]), codes
    assert codes["verification_uri"].endswith("/account/device")
    assert codes["verification_uri_complete"] == f"{codes['verification_uri']}?user_code={codes['user_code']}"
    assert (codes["interval"], codes["expires_in"]) == (0, 900)
    pending = await client.poll(codes["device_code"])
    assert (pending.status, pending.json["error"]) == (400, "authorization_pending")
    done = await person.approve(codes["verification_uri_complete"])
    assert done.status == 200 and "DEVICEDDDD" in text(done) and "Test App" in text(done)
    answer = assert_json(await client.poll(codes["device_code"]))
    assert answer["token_type"] == "Bearer" and answer["scope"] == scope("DEVICEDDDD")
    assert answer["expires_in"] == 300 and answer["refresh_token"]
    me = assert_json(await fetch(WHOAMI, token=answer["access_token"]))
    assert (me["user_id"], me["device_id"]) == ("@alice:localhost", "DEVICEDDDD")
    refreshed = assert_json(await client.refresh(answer["refresh_token"]))
    assert refreshed["scope"] == scope("DEVICEDDDD")
    # Used once: the next poll is invalid_grant, and the session stays.
    used = await client.poll(codes["device_code"])
    assert (used.status, used.json["error"]) == (400, "invalid_grant")
    assert (await fetch(WHOAMI, token=refreshed["access_token"])).status == 200


async def test_a_typed_code_any_case_without_the_dash(client, person, quick):
    codes = await client.codes("TYPEDDEV", scope=scope("TYPEDDEV", UNSTABLE))
    page = await person.open(codes["verification_uri"])
    html = text(page)
    assert page.status == 200 and html.count('type="password"') == 1 and "<script" not in html
    assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
    page = await person.submit(name="alice", password="wonderland")
    assert page.status == 200 and html.count("<input") >= 2
    assert re.findall(r'<input id="user_code" name="user_code" type="text"', text(page))
    confirm = await person.submit(user_code=codes["user_code"].replace("-", "").lower())
    html = text(confirm)
    buttons = re.findall(r'<button type="submit" name="op" value="([a-z]+)"', html)
    assert buttons == ["allow", "deny"], html
    assert "Test App" in html and "TYPEDDEV" in html and codes["user_code"] in html
    await person.submit(0)
    answer = assert_json(await client.poll(codes["device_code"]))
    assert answer["scope"] == scope("TYPEDDEV", UNSTABLE)  # the spelling asked


async def test_signed_in_on_the_account_page_only_confirms(client, person, quick):
    first = await client.codes("FIRSTDEV")
    await person.approve(first["verification_uri_complete"])
    second = await client.codes("SECONDDEV")
    page = await person.open(second["verification_uri_complete"])
    assert 'type="password"' not in text(page) and 'value="allow"' in text(page)
    # "Not you?": the sign-in form again, and the code goes on with the other person.
    assert "prompt=login" in text(page)
    other = await person.open(second["verification_uri_complete"] + "&prompt=login")
    assert 'type="password"' in text(other)
    confirm = await person.submit(name="bob", password="builder")
    assert "@bob:localhost" in text(confirm) and 'value="allow"' in text(confirm)
    # The account page links here.
    account = await person.open("/account/?action=org.matrix.profile")
    assert 'href="/account/device"' in text(account)


async def test_polling_sooner_than_the_interval_is_slow_down(client):
    codes = await client.codes()
    assert codes["interval"] == 5
    assert (await client.poll(codes["device_code"])).json["error"] == "authorization_pending"
    slow = await client.poll(codes["device_code"])
    assert (slow.status, slow.json["error"]) == (400, "slow_down")


async def test_denied_is_access_denied(client, person, quick):
    codes = await client.codes()
    done = await person.approve(codes["verification_uri_complete"], allow=False)
    assert "Denied" in text(done)
    for _ in range(2):
        denied = await client.poll(codes["device_code"])
        assert (denied.status, denied.json["error"]) == (400, "access_denied")
    # A decided code cannot be answered again on the page.
    again = await person.open(codes["verification_uri_complete"])
    assert again.status == 400 and 'value="allow"' not in text(again)


async def test_expired_is_expired_token(client, person, monkeypatch, quick):
    codes = await client.codes()
    later = device.now_ms() + 901_000
    monkeypatch.setattr(device, "now_ms", lambda: later)
    expired = await client.poll(codes["device_code"])
    assert (expired.status, expired.json["error"]) == (400, "expired_token")
    await person.open(codes["verification_uri_complete"])
    await person.submit(name="alice", password="wonderland")
    assert person.page is not None and person.page.status == 400 and "expired" in text(person.page)


async def test_refusals(client, fetch, person):
    await client.discover()
    unknown = await client.poll("mhd_not-a-code", client_id="x")
    assert (unknown.status, unknown.json["error"]) == (400, "invalid_grant")
    bad_scope = await client.ask(scope="urn:matrix:client:api:*")
    assert (bad_scope.status, bad_scope.json["error"]) == (400, "invalid_scope")
    two = await client.ask(scope=scope("A") + " urn:matrix:client:device:B")
    assert two.json["error"] == "invalid_scope"
    nobody = await client.ask(client_id="NOSUCHCLIENT")
    assert (nobody.status, nobody.json["error"]) == (401, "invalid_client")
    plain = client.__class__(fetch)
    resp = await plain.register()  # the code grant only
    plain.metadata = client.metadata
    refused = await plain.ask(client_id=resp.json["client_id"])
    assert (refused.status, refused.json["error"]) == (400, "unauthorized_client")
    codes = await client.codes()
    other = await client.poll(codes["device_code"], client_id=resp.json["client_id"])
    assert other.json["error"] == "invalid_grant"
    missing = await client.poll("")
    assert missing.json["error"] == "invalid_request"
    # A wrong code on the page: said so, nothing approved.
    await person.open(codes["verification_uri"])
    await person.submit(name="alice", password="wonderland")
    wrong = await person.submit(user_code="BBBB-BBBB")
    assert wrong.status == 400 and "not right" in text(wrong)
    # Without the XSRF token the page refuses the form.
    nothing = await fetch("/account/device", "POST", body="op=allow&user_code=x",
                          headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert nothing.status == 403


async def test_typed_codes_are_rate_limited_per_address(client, person):
    await client.discover()
    await person.open("/account/device")
    await person.submit(name="alice", password="wonderland")
    statuses = []
    for _ in range(device.TYPED_BURST + 1):
        statuses.append((await person.submit(user_code="BBBB-BBBB")).status)
    assert statuses[:-1] == [400] * device.TYPED_BURST and statuses[-1] == 429, statuses
    assert person.page is not None and person.page.headers["Retry-After"]


async def test_device_authorization_requests_are_rate_limited_per_address(client):
    await client.ensure_client()
    statuses = [(await client.ask()).status for _ in range(device.AUTHORIZE_BURST + 1)]
    assert statuses[:-1] == [200] * device.AUTHORIZE_BURST and statuses[-1] == 429, statuses


async def test_codes_are_never_logged(client, person, caplog, quick):
    caplog.set_level(logging.DEBUG)
    codes = await client.codes()
    await client.poll(codes["device_code"])
    await person.approve(codes["verification_uri_complete"])
    assert_json(await client.poll(codes["device_code"]))
    await client.poll(codes["device_code"])
    logged = "\n".join(record.getMessage() for record in caplog.records)
    user_code = codes["user_code"]
    for secret in (codes["device_code"], user_code, user_code.replace("-", "")):
        assert secret not in logged
    assert "/account/device?user_code=redacted" in logged  # the access line, scrubbed


async def test_the_confirmation_says_the_name_is_unverified_and_warns_of_codes_sent_by_others(fetch, person, quick):
    # RFC 8628 5.4, RFC 7591 5 (issue 34, finding 3): anyone can register a device-only client
    # called "Element X" with Element's address, and send the complete URI to a victim.
    borrowed = DeviceClient(fetch)
    await borrowed.discover()
    resp = await fetch(borrowed.path("registration_endpoint"), "POST", json_body={
        "client_name": "Element X", "client_uri": "https://app.element.io/", "application_type": "native",
        "token_endpoint_auth_method": "none", "grant_types": [DEVICE_GRANT, "refresh_token"]})
    borrowed.client_id = assert_json(resp, 201)["client_id"]
    codes = await borrowed.codes("PHISHED01")
    page = await person.open(codes["verification_uri_complete"])
    page = await person.submit(name="alice", password="wonderland")
    html = " ".join(text(page).split())
    assert 'value="allow"' in html
    assert "calls itself <strong>Element X</strong>" in html and "https://app.element.io/" in html
    assert "has not verified" in html
    assert "did not start" in html and "deny" in html.lower()
    # The sign-in page of the code grant says the same of the name and address.
    client = DeviceClient(fetch)
    authorize = await client.authorize_page(await client.params())
    assert "has not verified" in " ".join(text(authorize).split())
