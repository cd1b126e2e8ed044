"""Redirect URIs a browser reads otherwise than the registration check did, and text no JSON
answer can carry: refused at registration (RFC 7591 `invalid_redirect_uri` or
`invalid_client_metadata`), never kept or answered with a 500."""

from __future__ import annotations

import json

import pytest

from homeserver.oauth.clients import redirect_matches
from tests.oauth.test_refusals import oauth_error
from tests.support.helpers import assert_json
from tests.support.page_client import text

pytestmark = pytest.mark.usefixtures("io_loop")


@pytest.mark.parametrize(
    "overrides",
    [
        # A browser ends the authority at a backslash (WHATWG URL): the host is evil.example.com,
        # while urlsplit reads one under app.example.org and the page shows it so.
        {"application_type": "web", "redirect_uris": ["https://evil.example.com\\.app.example.org/cb"]},
        {"redirect_uris": ["https://evil.example.com\\.app.example.org/cb"]},  # a claimed https URI of a native client
        {"application_type": "web", "redirect_uris": ["https://evil.example.com%5C.app.example.org/cb"]},
        {"application_type": "web", "redirect_uris": ["https://app.example.org/c b"]},
        {"application_type": "web", "redirect_uris": ['https://app.example.org/"><x']},
        # A private-use scheme is a reverse domain name (RFC 8252 7.1: it has a period); a
        # one-label client_uri host would otherwise make javascript: or data: a redirect URI.
        {"client_uri": "https://javascript/", "redirect_uris": ["javascript:alert(1)"]},
        {"client_uri": "https://data/", "redirect_uris": ["data:text/html,hello"]},
    ],
)
async def test_redirect_uris_a_browser_reads_otherwise_are_refused(client, overrides):
    oauth_error(await client.register(**overrides), "invalid_redirect_uri")


@pytest.mark.parametrize(
    "field, value",
    [
        ("redirect_uris", ["org.example.app:/\ud800"]),
        ("redirect_uris", ["http://127.0.0.1/\udcff"]),
        ("client_name", "App \ud800"),
        ("client_uri", "https://app.example.org/\udcff"),
        ("policy_uri", "https://app.example.org/\ud800"),
    ],
)
async def test_lone_surrogates_are_refused_not_a_500(client, fetch, field, value):
    await client.discover()
    body = {
        "client_name": "App", "client_uri": "https://app.example.org/", "application_type": "native",
        "redirect_uris": ["org.example.app:/cb"], field: value,
    }
    raw = json.dumps(body)  # \\ud800 escapes: valid JSON, but no UTF-8 text
    resp = await fetch(client.path("registration_endpoint"), "POST", body=raw, headers={"Content-Type": "application/json"})
    assert resp.status == 400, resp
    assert resp.json["error"] in ("invalid_redirect_uri", "invalid_client_metadata"), resp


async def test_ordinary_redirect_uris_still_register(client):
    uris = ["org.example.app:/cb", "https://app.example.org/cb?x=1&y=%2F", "http://127.0.0.1/cb", "http://[::1]/cb"]
    body = assert_json(await client.register(redirect_uris=uris), 201)
    assert body["redirect_uris"] == uris
    # Host names browsers take though DNS hostnames may not (an underscore) stay accepted.
    web = {"application_type": "web", "client_uri": "https://my_app.example.org/", "redirect_uris": ["https://my_app.example.org/cb"]}
    assert_json(await client.register(**web), 201)


@pytest.mark.parametrize("name", ["App\n2026-01-01 00:00:00 [1] INFO homeserver.audit: login success", "App\r", "App\x1b[31m", "App\x85"])
async def test_a_client_name_with_control_characters_is_refused(client, name):
    # The name is logged at registration and becomes the device's display name: a line break in
    # it would forge log lines (the audit trail's among them).
    oauth_error(await client.register(client_name=name), "invalid_client_metadata")


# -- issue 34, finding 9: a loopback redirect matches exactly but for its port ---------------------

REGISTERED = ["http://127.0.0.1/callback", "http://[::1]:8080/cb?x=1", "http://localhost/cb"]


@pytest.mark.parametrize(
    "given",
    ["http://127.0.0.1/callback", "http://127.0.0.1:53123/callback", "http://127.0.0.1:65535/callback",
     "http://[::1]/cb?x=1", "http://[::1]:1/cb?x=1", "http://localhost:4000/cb"],
)
def test_a_loopback_redirect_takes_any_port(given):
    assert redirect_matches(REGISTERED, given)


@pytest.mark.parametrize(
    "given",
    [
        "http://127.0.0.1:53123/callback#",  # the code would land after the fragment mark
        "http://127.0.0.1:53123/callback?",
        "http://127.0.0.1/callback#",
        "http://127.0.0.1/callback?",
        "HTTP://127.0.0.1:53123/callback",
        "Http://127.0.0.1/callback",
        "http://127.0.0.1:0/callback",
        "http://127.0.0.1:053123/callback",
        "http://127.0.0.1:65536/callback",
        "http://127.0.0.1:/callback",
        "http://127.0.0.1:53123/Callback",
        "http://127.0.0.1:53123/callback/",
        "http://localhost:53123/callback",  # another loopback host than registered
        "http://LOCALHOST:4000/cb",
        "http://[::1]:8080/cb?x=1&y=2",
        "http://user@127.0.0.1:5/callback",
    ],
)
def test_anything_else_about_a_loopback_redirect_is_exact(given):
    assert not redirect_matches(REGISTERED, given)


async def test_a_loopback_redirect_that_is_not_exact_is_an_error_page(client):
    params = await client.params()
    for given in ("http://127.0.0.1:53123/callback#", "HTTP://127.0.0.1:53123/callback", "http://127.0.0.1:0/callback"):
        resp = await client.authorize_page({**params, "redirect_uri": given})
        assert resp.status == 400 and "Location" not in resp.headers, (given, resp)


async def test_the_form_may_go_on_to_an_ipv6_loopback_redirect(client):
    # CSP host sources cannot name an IPv6 literal (a browser drops `http://[::1]:53123` and the
    # redirect with the code is blocked): the form goes on by the scheme, as the SSO page's does.
    body = assert_json(await client.register(redirect_uris=["http://[::1]/cb"]), 201)
    params = {**await client.params(), "client_id": body["client_id"], "redirect_uri": "http://[::1]:53123/cb"}
    page = await client.authorize_page(params)
    assert page.status == 200, page
    assert "form-action 'self' http:;" in page.headers["Content-Security-Policy"], page.headers


# -- issue 34, finding 5: no character that reorders or hides text in a name people are shown ------

INVISIBLE = ["\u202e", "\u202d", "\u202a", "\u2066", "\u2067", "\u2068", "\u2069", "\u200e", "\u200f", "\u061c",
             "\ufeff", "\u00ad", "\u2060", "\u2028", "\u2029", "\U000e0041", "\ue000", "\U0010fffd"]


@pytest.mark.parametrize("char", INVISIBLE)
async def test_a_client_name_with_a_format_or_bidi_character_is_refused(client, char):
    # U+202E reversed the rest of the consent line, the shown address included.
    oauth_error(await client.register(client_name=f"Good App{char} (https://app.example.org)"), "invalid_client_metadata")


async def test_names_in_any_script_and_emoji_stay(client):
    for name in ("Élément ✨", "عنصر", "אלמנט", "मैट्रिक्स", "می‌خواهم", "👩‍💻 Chat"):  # ZWNJ and ZWJ are letters' glue
        assert assert_json(await client.register(client_name=name), 201)["client_name"] == name


async def test_a_name_kept_from_before_is_shown_without_them(client, hs):
    # A client registered before the rule: its name is shown with them taken out.
    await client.ensure_client()
    kept = await hs.oauth.store.client(client.client_id)
    await hs.oauth.store.add_client("OLDCLIENT", {**kept, "client_id": "OLDCLIENT", "client_name": "Evil\u202eelgooG"}, 60)
    params = await client.params()
    page = await client.authorize_page({**params, "client_id": "OLDCLIENT"})
    assert page.status == 200 and "\u202e" not in text(page) and "EvilelgooG" in text(page)
