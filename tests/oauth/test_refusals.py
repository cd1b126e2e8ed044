"""What the OAuth 2.0 API refuses, each with its RFC error: registration (RFC 7591), the
authorization request (RFC 6749 4.1.2.1, RFC 7636) and the code exchange (RFC 6749 5.2)."""

from __future__ import annotations

import re
from html import unescape
from urllib.parse import urlencode

import pytest

from tests.oauth.conftest import REDIRECT, redirect_values, scope
from tests.support.helpers import assert_error, assert_json
from tests.support.page_client import text

pytestmark = pytest.mark.usefixtures("io_loop")

WHOAMI = "/_matrix/client/v3/account/whoami"


def oauth_error(resp, error: str, status: int = 400) -> dict:
    assert resp.status == status, resp
    assert resp.headers["Content-Type"] == "application/json", resp
    body = resp.json
    assert body["error"] == error and isinstance(body["error_description"], str), resp
    return body


# -- registration -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, error",
    [
        ({"application_type": "web", "redirect_uris": ["http://app.example.org/cb"]}, "invalid_redirect_uri"),
        ({"application_type": "web", "redirect_uris": ["http://localhost/cb"]}, "invalid_redirect_uri"),
        ({"application_type": "web", "redirect_uris": ["https://evil.example.com/cb"]}, "invalid_redirect_uri"),
        ({"application_type": "web", "redirect_uris": ["https://app.example.org/cb#frag"]}, "invalid_redirect_uri"),
        ({"redirect_uris": ["http://127.0.0.1/cb#x"]}, "invalid_redirect_uri"),
        ({"redirect_uris": ["http://example.org/cb"]}, "invalid_redirect_uri"),  # native http off the loopback
        ({"redirect_uris": ["com.evil:/cb"]}, "invalid_redirect_uri"),  # not the reverse-DNS of client_uri
        ({"redirect_uris": ["org.example.app://cb"]}, "invalid_redirect_uri"),  # an authority
        ({"redirect_uris": []}, "invalid_redirect_uri"),
        ({"client_uri": None}, "invalid_client_metadata"),
        ({"client_uri": "http://app.example.org/"}, "invalid_client_metadata"),
        ({"token_endpoint_auth_method": "client_secret_basic"}, "invalid_client_metadata"),
        ({"response_types": ["token"]}, "invalid_client_metadata"),
        ({"application_type": "desktop"}, "invalid_client_metadata"),
        ({"logo_uri": "https://elsewhere.example.com/logo.png"}, "invalid_client_metadata"),
    ],
)
async def test_registration_refusals(client, overrides, error):
    body = {k: v for k, v in overrides.items() if v is not None}
    resp = await client.register(**body)
    if overrides.get("client_uri", "") is None:
        await client.discover()
        full = {"client_name": "x", "redirect_uris": [REDIRECT]}
        resp = await client.fetch(client.path("registration_endpoint"), "POST", json_body=full)
    oauth_error(resp, error)


@pytest.mark.parametrize("body", [b"", b"[]", b"not json", b"[" * 100_000, b'{"redirect_uris": [1]}', b'{"client_name": 5}'])
async def test_registration_of_malformed_bodies(client, body):
    await client.discover()
    resp = await client.fetch(client.path("registration_endpoint"), "POST", body=body, headers={"Content-Type": "application/json"})
    assert resp.status in (400, 413), resp
    assert resp.json["error"] in ("invalid_client_metadata", "invalid_redirect_uri", "invalid_request"), resp


@pytest.mark.parametrize(
    "overrides",
    [
        {"application_type": "web", "redirect_uris": ["https://app.example.org/cb", "https://sub.app.example.org:8443/cb?x=1"]},
        {"redirect_uris": ["org.example.app:/callback", "org.example.app.sub:cb"]},
        {"redirect_uris": ["http://localhost/cb", "http://[::1]/cb", "http://127.0.0.1:1234/cb"]},
    ],
)
async def test_registrations_taken(client, overrides):
    body = assert_json(await client.register(**overrides), 201)
    assert body["client_id"] and body["redirect_uris"] == overrides["redirect_uris"]
    assert body["token_endpoint_auth_method"] == "none"


async def test_registration_drops_grant_types_it_lacks(client):
    body = assert_json(await client.register(grant_types=["authorization_code", "refresh_token", "urn:ietf:params:oauth:grant-type:token-exchange"]), 201)
    assert body["grant_types"] == ["authorization_code", "refresh_token"]


async def test_registrations_are_rate_limited_per_address(client):
    for _ in range(20):
        assert (await client.register()).status == 201
    resp = await client.register()
    oauth_error(resp, "temporarily_unavailable", 429)
    assert int(resp.headers["Retry-After"]) >= 1


class TestNoRateLimits:
    @pytest.fixture
    def config_overrides(self):
        return {"oauth": {"enabled": True}, "rate_limit": {"enabled": False}}

    async def test_registrations_are_not_limited(self, client):
        for _ in range(25):
            assert (await client.register()).status == 201


# -- the authorization request --------------------------------------------------------------------


async def test_unknown_client_is_an_error_page_never_a_redirect(client):
    await client.ensure_client()
    params = await client.params()
    for changed in ({"client_id": "NOSUCHCLIENT"}, {"client_id": ""}, {"redirect_uri": "https://evil.example.com/cb"},
                    {"redirect_uri": "http://127.0.0.1/other"}):
        resp = await client.authorize_page({**params, **changed})
        assert resp.status == 400, resp
        assert "Location" not in resp.headers
        assert "Cannot sign in" in text(resp) and "evil" not in text(resp)


async def test_loopback_redirects_take_any_port(client):
    params = await client.params(redirect_uri="http://127.0.0.1:53123/callback")
    resp = await client.sign_in(params)
    assert resp.status == 303 and resp.headers["Location"].startswith("http://127.0.0.1:53123/callback?code=")


AUTHORIZATION_ERRORS = [
    ({"code_challenge_method": "plain"}, "invalid_request"),
    ({"code_challenge_method": None}, "invalid_request"),  # plain by default (RFC 7636)
    ({"code_challenge": None, "code_challenge_method": None}, "invalid_request"),
    ({"response_type": "token"}, "unsupported_response_type"),
    ({"scope": "urn:matrix:client:api:*"}, "invalid_scope"),  # no device scope
    ({"scope": scope("AAAAAAAAAA") + " urn:matrix:client:device:BBBBBBBBBB"}, "invalid_scope"),  # two
    ({"scope": "urn:matrix:client:device:AAAAAAAAAA"}, "invalid_scope"),  # no API scope
    ({"scope": scope("AAAAAAAAAA") + " urn:synapse:admin:*"}, "invalid_scope"),
    ({"scope": scope("bad device")}, "invalid_scope"),
    ({"response_mode": "form_post"}, "invalid_request"),
    ({"prompt": "none"}, "login_required"),
]


def changed(params: dict[str, str], changes: dict[str, str | None]) -> dict[str, str]:
    params = dict(params)
    for key, value in changes.items():
        if value is None:
            params.pop(key, None)
        else:
            params[key] = value
    return params


def links_to(html: str, redirect: str) -> list[dict[str, str]]:
    """The values of every link of the page to the client's redirect URI."""
    return [redirect_values(unescape(href)) for href in re.findall(r'href="([^"]*)"', html)
            if unescape(href).startswith(redirect)]


@pytest.mark.parametrize("changes, error", AUTHORIZATION_ERRORS)
async def test_authorization_errors_are_a_page_never_a_redirect(client, changes, error):
    # RFC 9700 4.11.2 (issue 34, finding 1): anyone may register a client whose redirect is
    # their own site; a request made wrong on purpose must not bounce a browser there.
    params = changed(await client.params(), changes)
    resp = await client.authorize_page(params)
    assert resp.status == 400 and "Location" not in resp.headers, resp
    html = text(resp)
    assert "Cannot sign in" in html and "not sent anywhere" in html
    assert links_to(html, REDIRECT) == [] and REDIRECT not in html  # nothing to follow there


@pytest.mark.parametrize("changes, error", AUTHORIZATION_ERRORS)
async def test_a_signed_in_person_may_take_the_error_back_to_the_application(client, changes, error):
    # Signed in, the person is shown the error and where a link goes, and decides (RFC 9700
    # 4.11.2: "inform the user and rely on the user to make a decision"); nothing is automatic.
    await client.login("FIRSTDEVICE")
    params = changed(await client.params("SECONDDEVICE"), changes)
    resp = await client.authorize_page(params)
    assert resp.status == 400 and "Location" not in resp.headers, resp
    html = text(resp)
    assert REDIRECT in html  # the address the link goes to, shown
    [values] = links_to(html, REDIRECT)
    assert values["error"] == error and values["state"] == params["state"], values
    assert values["iss"] == client.metadata["issuer"]


async def test_a_repeated_parameter_is_refused(client):
    params = await client.params()
    url = client.path("authorization_endpoint") + "?" + urlencode(params) + "&" + urlencode({"scope": scope("OTHERDEVICE")})
    resp = await client.fetch(url, follow_redirects=False)
    assert resp.status == 400 and "Location" not in resp.headers and "given more than once" in text(resp)


# -- the code exchange --------------------------------------------------------------------------


async def test_a_code_used_twice_is_invalid_grant_and_ends_what_the_first_made(client, fetch):
    code, _ = await client.code("TWICE00001")
    first = assert_json(await client.exchange(code))
    assert_json(await fetch(WHOAMI, token=first["access_token"]))
    oauth_error(await client.exchange(code), "invalid_grant")
    body = assert_error(await fetch(WHOAMI, token=first["access_token"]), 401, "M_UNKNOWN_TOKEN")
    assert body["soft_logout"] is False
    oauth_error(await client.refresh(first["refresh_token"]), "invalid_grant")


async def test_a_wrong_verifier_is_invalid_grant_and_spends_the_code(client):
    code, _ = await client.code(verifier="a" * 43)
    oauth_error(await client.exchange(code, verifier="b" * 43), "invalid_grant")
    oauth_error(await client.exchange(code, verifier="a" * 43), "invalid_grant")


async def test_code_exchange_refusals(client):
    code, _ = await client.code()
    oauth_error(await client.token(grant_type="authorization_code", code=code, client_id=client.client_id, redirect_uri=REDIRECT), "invalid_request")
    oauth_error(await client.token(grant_type="password", username="alice", password="wonderland"), "unsupported_grant_type")
    oauth_error(await client.token(), "invalid_request")
    oauth_error(await client.exchange("no-such-code"), "invalid_grant")
    code, _ = await client.code()
    other = {"redirect_uri": "http://127.0.0.1/other", "client_id": client.client_id, "code_verifier": "v" * 43}
    oauth_error(await client.token(grant_type="authorization_code", code=code, **other), "invalid_grant")
    code, _ = await client.code()
    oauth_error(await client.token(grant_type="authorization_code", code=code, redirect_uri=REDIRECT, client_id="SOMEONEELSE", code_verifier="v" * 43), "invalid_grant")
    code, _ = await client.code()
    oauth_error(await client.token(grant_type="authorization_code", code=code, redirect_uri=REDIRECT, client_id="ÄÖÜ", code_verifier="v" * 43), "invalid_grant")
    oauth_error(await client.token(grant_type="refresh_token", refresh_token="é" * 10, client_id="ü"), "invalid_grant")


async def test_a_lock_between_sign_in_and_exchange_is_invalid_grant(client, backend, users_path):
    from tests.handlers.test_account_state import edit_users, with_alice

    code, _ = await client.code()
    await edit_users(backend, users_path, with_alice(locked=True))
    oauth_error(await client.exchange(code), "invalid_grant")


async def test_a_store_down_is_503_temporarily_unavailable(client, hs, monkeypatch):
    from backends.base import StoreUnavailable

    code, _ = await client.code()

    async def down(*args, **kwargs):
        raise StoreUnavailable("down for the test", store="session store")

    monkeypatch.setattr(hs.oauth.store, "take_code", down)
    resp = await client.exchange(code)
    body = oauth_error(resp, "temporarily_unavailable", 503)
    assert "session store" in body["error_description"] and resp.headers["Retry-After"]
    monkeypatch.setattr(hs.oauth.store, "client", down)
    page = await client.authorize_page(await client.params())
    assert page.status == 503 and "Try again" in text(page)
