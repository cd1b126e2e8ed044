"""The OAuth 2.0 API over HTTP: discovery (valid against v1.18's schema), registration, the sign-in
page, the code grant, tokens on our own endpoints, refresh and revocation."""

from __future__ import annotations

import os
import re
from html import unescape
from typing import Any

import jsonschema
import pytest

from tests.oauth.conftest import REDIRECT, UNSTABLE, redirect_values, scope
from tests.support.helpers import assert_error, assert_json
from tests.support.openapi import _inline, _load
from tests.support.page_client import text

pytestmark = pytest.mark.usefixtures("io_loop")

OAUTH_SPEC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "matrix-spec", "oauth", "data", "api", "client-server")
WHOAMI = "/_matrix/client/v3/account/whoami"
DEVICES = "/_matrix/client/v3/devices"


def metadata_schema(status: int = 200) -> dict[str, Any]:
    file = os.path.join(OAUTH_SPEC, "oauth_server_metadata.yaml")
    response = _load(file)["paths"]["/auth_metadata"]["get"]["responses"][str(status)]
    return _inline(response["content"]["application/json"]["schema"], file)


async def test_metadata_is_valid_against_the_v1_18_schema(fetch):
    body = assert_json(await fetch("/_matrix/client/v1/auth_metadata"))
    jsonschema.validate(body, metadata_schema())
    assert body["issuer"] == "http://127.0.0.1:8008/" or body["issuer"].endswith("/")
    assert "code" in body["response_types_supported"]
    assert {"authorization_code", "refresh_token"} <= set(body["grant_types_supported"])
    assert {"query", "fragment"} <= set(body["response_modes_supported"])
    assert body["code_challenge_methods_supported"] == ["S256"]
    assert "prompt_values_supported" not in body  # we create no accounts
    assert body["account_management_uri"].endswith("/account/")
    assert "org.matrix.devices_list" in body["account_management_actions_supported"]
    unstable = assert_json(await fetch("/_matrix/client/unstable/org.matrix.msc2965/auth_metadata"))
    assert {k: v for k, v in unstable.items() if k != "account_management_actions_supported"} == {
        k: v for k, v in body.items() if k != "account_management_actions_supported"
    }
    assert "org.matrix.sessions_list" in unstable["account_management_actions_supported"]
    openid = assert_json(await fetch("/.well-known/openid-configuration"))
    assert openid == body  # no delegation here: no introspection endpoint
    assert assert_json(await fetch("/.well-known/oauth-authorization-server")) == body  # RFC 8414's path
    # Password login stays.
    flows = assert_json(await fetch("/_matrix/client/v3/login"))["flows"]
    assert {"type": "m.login.password"} in flows


class TestOff:
    @pytest.fixture
    def config_overrides(self):
        return {}

    async def test_everything_is_unrecognized(self, fetch):
        for path in ("/_matrix/client/v1/auth_metadata", "/_matrix/client/unstable/org.matrix.msc2965/auth_metadata"):
            resp = await fetch(path)
            assert_error(resp, 404, "M_UNRECOGNIZED")
            jsonschema.validate(resp.json, metadata_schema(404))
        assert_error(await fetch("/.well-known/openid-configuration"), 404, "M_UNRECOGNIZED")
        assert_error(await fetch("/.well-known/oauth-authorization-server"), 404, "M_UNRECOGNIZED")
        assert_error(await fetch("/oauth2/token", "POST", body="grant_type=refresh_token"), 404, "M_UNRECOGNIZED")
        assert (await fetch("/account/authorize?client_id=x")).status == 404


async def test_sign_in_page_shows_the_client_and_the_redirect(client):
    params = await client.params()
    page = await client.authorize_page(params)
    assert page.status == 200, page
    html = text(page)
    assert "Test App" in html and REDIRECT in html and "DEVICEAAAA" in html
    assert "<script" not in html
    assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
    assert "form-action 'self' http://127.0.0.1" in page.headers["Content-Security-Policy"]
    assert page.headers["X-Frame-Options"] == "DENY"
    assert html.count('type="password"') == 1 and html.count('name="name"') == 1
    # The first submit button signs in.
    first = html.index("<button")
    assert 'value="sign_in"' in html[first : html.index(">", first)]
    # Without the XSRF token the form is refused.
    refused = await client.fetch("/account/authorize", "POST", body="op=sign_in&name=alice&password=wonderland",
                                 headers={"Content-Type": "application/x-www-form-urlencoded"}, follow_redirects=False)
    assert refused.status == 403


async def test_full_flow_tokens_work_everywhere(client, fetch):
    tokens = await client.login("PHONE12345")
    assert tokens["token_type"] == "Bearer" and tokens["expires_in"] == 300
    assert tokens["scope"] == scope("PHONE12345")
    access = tokens["access_token"]
    whoami = assert_json(await fetch(WHOAMI, token=access))
    assert whoami["user_id"] == "@alice:localhost" and whoami["device_id"] == "PHONE12345"
    devices = assert_json(await fetch(DEVICES, token=access))["devices"]
    assert [d["device_id"] for d in devices] == ["PHONE12345"]
    assert devices[0]["display_name"] == "Test App"
    # Refresh: new tokens, the old access token still works until it expires.
    fresh = assert_json(await client.refresh(tokens["refresh_token"]))
    assert fresh["refresh_token"] != tokens["refresh_token"] and fresh["access_token"] != access
    assert_json(await fetch(WHOAMI, token=fresh["access_token"]))
    # Revocation of the refresh token ends the session: both access tokens stop.
    assert_json(await client.revoke(fresh["refresh_token"], token_type_hint="refresh_token"))
    for token in (access, fresh["access_token"]):
        body = assert_error(await fetch(WHOAMI, token=token), 401, "M_UNKNOWN_TOKEN")
        assert body["soft_logout"] is False
    resp = await client.refresh(fresh["refresh_token"])
    assert resp.status == 400 and resp.json["error"] == "invalid_grant"


async def test_unstable_scopes_are_answered_in_their_spelling(client, fetch):
    code, _ = await client.code("ELEMENTX01", scope=f"openid {scope('ELEMENTX01', UNSTABLE)}")
    tokens = assert_json(await client.exchange(code))
    assert tokens["scope"] == scope("ELEMENTX01", UNSTABLE)
    assert assert_json(await fetch(WHOAMI, token=tokens["access_token"]))["device_id"] == "ELEMENTX01"


async def test_fragment_mode_and_state(client):
    params = await client.params(response_mode="fragment")
    resp = await client.sign_in(params)
    location = resp.headers["Location"]
    assert location.startswith(REDIRECT + "#")
    assert redirect_values(location)["state"] == params["state"]


async def test_a_signed_in_person_confirms_without_the_password(client, fetch):
    await client.login("FIRSTDEVICE")
    page = await client.authorize_page(await client.params("SECONDDEVICE"))
    html = text(page)
    assert 'type="password"' not in html
    first = html.index("<button")
    assert 'value="confirm"' in html[first : html.index(">", first)]
    resp = await client.submit(page, op="confirm")
    assert resp.status == 303 and "code=" in resp.headers["Location"]
    switch = re.search(r'<a href="([^"]+)">Not you\?', html)
    assert switch is not None and "prompt=login" in unescape(switch.group(1))


async def test_prompt_login_asks_for_the_password_and_prompt_none_is_refused(client):
    await client.login("FIRSTDEVICE")
    page = await client.authorize_page(await client.params("SECONDDEVICE", prompt="login"))
    assert 'type="password"' in text(page)
    assert (await client.submit(page, op="confirm")).status == 401
    params = await client.params("THIRDDEVICE", prompt="none")
    resp = await client.authorize_page(params)
    assert resp.status == 400 and "Location" not in resp.headers  # a page, never a redirect (34.1)
    assert "error=login_required" in text(resp)  # the link the person may follow back


async def test_a_wrong_password_stays_on_the_page(client):
    params = await client.params()
    resp = await client.sign_in(params, password="nope")
    assert resp.status == 403 and "Wrong name or password." in text(resp)
    resp = await client.sign_in(params, name="ALICE")  # names as login takes them
    assert resp.status == 303


async def test_cancel_before_signing_in_sends_nobody_anywhere(client):
    # RFC 9700 4.11.2 (issue 34, finding 1): "Cancel" on the sign-in page of a client made for
    # it must not take the browser to the client's site.
    params = await client.params()
    page = await client.authorize_page(params)
    resp = await client.submit(page, op="deny")
    assert resp.status == 200 and "Location" not in resp.headers, resp
    html = text(resp)
    assert "Nothing was shared" in html and "not sent anywhere" in html and REDIRECT not in html


async def test_cancel_after_signing_in_offers_the_way_back(client):
    await client.login("FIRSTDEVICE")
    params = await client.params("SECONDDEVICE")
    page = await client.authorize_page(params)
    resp = await client.submit(page, op="deny")
    assert resp.status == 200 and "Location" not in resp.headers, resp
    html = text(resp)
    assert "Nothing was shared" in html
    back = [unescape(h) for h in re.findall(r'href="([^"]*)"', html) if unescape(h).startswith(REDIRECT)]
    assert [redirect_values(h) for h in back] == [{
        "error": "access_denied", "error_description": "the person did not allow it", "state": params["state"],
        "iss": client.metadata["issuer"],
    }]


async def test_logout_and_device_deletion_end_oauth_sessions(client, fetch, login):
    tokens = await client.login("LAPTOP0001")
    assert_json(await fetch("/_matrix/client/v3/logout", "POST", token=tokens["access_token"]))
    resp = await client.refresh(tokens["refresh_token"])
    assert resp.status == 400 and resp.json["error"] == "invalid_grant"
    tokens = await client.login("LAPTOP0002")
    password = (await login())["access_token"]
    body = {"devices": ["LAPTOP0002"], "auth": {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": "alice"}, "password": "wonderland"}}
    resp = await fetch("/_matrix/client/v3/delete_devices", "POST", json_body=body, token=password)
    assert resp.status == 200, resp
    resp = await client.refresh(tokens["refresh_token"])
    assert resp.status == 400 and resp.json["error"] == "invalid_grant"


async def test_naming_a_device_with_a_session_replaces_it(client, fetch, login):
    old = (await login(device_id="SHARED0001"))["access_token"]
    tokens = await client.login("SHARED0001")
    assert_error(await fetch(WHOAMI, token=old), 401, "M_UNKNOWN_TOKEN")
    assert_json(await fetch(WHOAMI, token=tokens["access_token"]))


async def test_revoking_the_access_token_ends_the_session(client, fetch):
    tokens = await client.login()
    assert_json(await client.revoke(tokens["access_token"]))
    assert_error(await fetch(WHOAMI, token=tokens["access_token"]), 401, "M_UNKNOWN_TOKEN")
    resp = await client.refresh(tokens["refresh_token"])
    assert resp.status == 400 and resp.json["error"] == "invalid_grant"
    assert assert_json(await client.revoke("never-issued")) == {}  # unknown: 200
    resp = await client.revoke("")
    assert resp.status == 400 and resp.json["error"] == "invalid_request"


class TestMetrics:
    @pytest.fixture
    def config_overrides(self):
        return {"oauth": {"enabled": True}, "metrics": {"enabled": True}}

    async def test_a_sign_in_is_one_session_opened_and_a_refresh_none(self, client, hs):
        tokens = await client.login("METRICS001")
        assert_json(await client.refresh(tokens["refresh_token"]))
        text, _ = hs.metrics.render(None)
        assert "homeserver_sessions_opened_total 1.0" in text.decode()


async def test_the_authorization_response_names_its_issuer(client, fetch):
    # RFC 9207 (issue 34, finding 10): a client holding accounts on several servers knows which
    # one answered; the metadata says so at every path.
    metadata = await client.discover()
    assert metadata["authorization_response_iss_parameter_supported"] is True
    for path in ("/.well-known/openid-configuration", "/.well-known/oauth-authorization-server",
                 "/_matrix/client/unstable/org.matrix.msc2965/auth_metadata"):
        assert assert_json(await fetch(path))["authorization_response_iss_parameter_supported"] is True
    for mode in ("query", "fragment"):
        params = await client.params(response_mode=mode)
        values = redirect_values((await client.sign_in(params)).headers["Location"])
        assert values["iss"] == metadata["issuer"] and values["state"] == params["state"] and values["code"]
