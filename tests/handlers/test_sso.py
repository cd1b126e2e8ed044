"""Legacy clients through the browser (MSC3824): GET /login's flows with and without `[mfa]` /
`[oauth]`, GET /login/sso/redirect's checks (JSON errors before any page, never an open
redirect), and the page it leads to: the browser sign-in, "continue to <host>", then the
redirect with `loginToken=…` (its use: test_login_token.py)."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest

from tests.support.helpers import assert_error, assert_json
from tests.support.openapi import validate
from tests.support.page_client import Browser, assert_page, text

LOGIN = "/_matrix/client/v3/login"
REDIRECT = "/_matrix/client/v3/login/sso/redirect"
PAGE = "/account/sso"
CLIENT = "https://client.example.org/app/?session=1#/home"
PASSWORD_ONLY = {"flows": [{"type": "m.login.password"}]}
IDP = {"id": "homeserver", "name": "localhost"}

MFA = {"mfa": {"enabled": True}}
OAUTH = {"oauth": {"enabled": True}}


@pytest.fixture
def config_overrides():
    return MFA


@pytest.fixture
def browser(fetch) -> Browser:
    return Browser(fetch)


def query_of(url: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(url).query)


# -- GET /login -------------------------------------------------------------------------------


@pytest.mark.parametrize("config_overrides", [{}, {"mfa": {"enabled": False}, "oauth": {"enabled": False}}])
async def test_the_default_configuration_keeps_the_single_password_flow(fetch, config_overrides):
    resp = await fetch(LOGIN)
    assert assert_json(resp) == PASSWORD_ONLY
    validate(resp, "login.yaml", "/login")


async def test_with_mfa_the_flows_add_sso_with_one_identity_provider_and_token(fetch):
    resp = await fetch(LOGIN)
    assert assert_json(resp) == {
        "flows": [
            {"type": "m.login.password"},
            {"type": "m.login.sso", "identity_providers": [IDP]},
            {"type": "m.login.token"},
        ]
    }
    validate(resp, "login.yaml", "/login")


@pytest.mark.parametrize("config_overrides", [OAUTH, {**OAUTH, **MFA}])
async def test_with_oauth_the_sso_flow_is_preferred_as_matrix_1_18_and_msc3824_say(fetch, config_overrides):
    resp = await fetch(LOGIN)
    assert assert_json(resp) == {
        "flows": [
            {"type": "m.login.password"},
            {
                "type": "m.login.sso",
                "identity_providers": [IDP],
                "oauth_aware_preferred": True,
                "org.matrix.msc3824.delegated_oidc_compatibility": True,
            },
            {"type": "m.login.token"},
        ]
    }
    validate(resp, "login.yaml", "/login")


# -- GET /login/sso/redirect ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [REDIRECT, REDIRECT + "/", REDIRECT + "/homeserver", REDIRECT + "/oidc-anything",
     "/_matrix/client/r0/login/sso/redirect", "/_matrix/client/r0/login/sso/redirect/homeserver"],
)
async def test_the_redirect_leads_to_our_page_with_the_url_and_action(fetch, path):
    resp = await fetch(path + "?" + urlencode({"redirectUrl": CLIENT, "action": "login"}), follow_redirects=False)
    assert resp.status == 302, resp
    location = resp.headers["Location"]
    assert location.startswith(PAGE + "?"), location  # a path: the browser stays on this host
    assert query_of(location) == {"redirectUrl": [CLIENT], "action": ["login"]}
    assert resp.body == b""


@pytest.mark.parametrize(
    ("query", "action"),
    [
        ({"org.matrix.msc3824.action": "register"}, ["register"]),
        ({"action": "register", "org.matrix.msc3824.action": "register"}, ["register"]),  # js-sdk sends both
        ({"action": "undefinedaction"}, None),  # unknown actions dropped, as MAS does
        ({}, None),
    ],
)
async def test_the_action_stable_or_unstable_is_carried_unknown_ones_dropped(fetch, query, action):
    resp = await fetch(REDIRECT + "?" + urlencode({"redirectUrl": CLIENT, **query}), follow_redirects=False)
    assert resp.status == 302, resp
    assert query_of(resp.headers["Location"]).get("action") == action


REFUSED = [
    "javascript:alert(document.cookie)",
    "JavaScript:alert(1)",
    "data:text/html,<h1>hi</h1>",
    "file:///etc/passwd",
    "vbscript:msgbox",
    "https://user:pass@client.example.org/",
    "https://evil.example@client.example.org/",
    "im.fluffychat://user@login",
    "/relative/path",
    "//client.example.org/no-scheme",
    "client.example.org/path",
    "https:///no-host",
    "https:client.example.org",
    "http://exa mple.org/",
    "https://client.example.org\\@evil.example/",
    "https://client.example.org/é",
    "https://client.example.org:99999/",
    "https://" + "a" * 2100 + ".org/",
]


@pytest.mark.parametrize("url", REFUSED)
async def test_a_refused_redirect_url_is_a_400_matrix_error_before_any_page(fetch, url):
    resp = await fetch(REDIRECT + "?" + urlencode({"redirectUrl": url}), follow_redirects=False)
    body = assert_error(resp, 400, "M_INVALID_PARAM")
    assert "Location" not in resp.headers
    assert body["error"].startswith("Parameter redirectUrl must be ")
    assert resp.headers["Content-Type"] == "application/json"


@pytest.mark.parametrize("query", ["", "?redirectUrl=", "?action=login"])
async def test_a_missing_redirect_url_is_400_missing_param(fetch, query):
    resp = await fetch(REDIRECT + query, follow_redirects=False)
    assert_error(resp, 400, "M_MISSING_PARAM", "Missing parameter: redirectUrl")


@pytest.mark.parametrize(
    "url",
    ["im.fluffychat://login", "element://connect", "io.element.android:/callback", "myapp:///sso",
     "http://localhost:29110/", "http://127.0.0.1:8123/cb?x=1", "https://[::1]:8443/cb",
     "https://app.element.io/#/login", "https://xn--bcher-kva.example/"],
)
async def test_application_schemes_loopback_and_fragments_are_taken(fetch, url):
    resp = await fetch(REDIRECT + "?" + urlencode({"redirectUrl": url}), follow_redirects=False)
    assert resp.status == 302, resp
    assert query_of(resp.headers["Location"])["redirectUrl"] == [url]


@pytest.mark.parametrize("config_overrides", [{}])
async def test_with_mfa_and_oauth_off_there_is_no_sso_redirect_nor_page(fetch, config_overrides):
    resp = await fetch(REDIRECT + "?" + urlencode({"redirectUrl": CLIENT}), follow_redirects=False)
    assert_error(resp, 404, "M_UNRECOGNIZED")
    resp = await fetch(PAGE + "?" + urlencode({"redirectUrl": CLIENT}), follow_redirects=False)
    assert "There is no such page." in assert_page(resp, 404)


# -- the page -------------------------------------------------------------------------------


def page_url(redirect_url: str = CLIENT, **extra: str) -> str:
    return PAGE + "?" + urlencode({"redirectUrl": redirect_url, **extra})


def form_action(body: str) -> str:
    return re.search(r'<form method="post" action="([^"]+)"', body).group(1).replace("&amp;", "&")


async def start(browser: Browser, redirect_url: str = CLIENT, **extra: str):
    """Follow the client's redirect to the page, as a browser does; the page's answer."""
    resp = await browser.fetch(REDIRECT + "?" + urlencode({"redirectUrl": redirect_url, **extra}),
                               follow_redirects=False)
    assert resp.status == 302, resp
    return await browser.get(path=resp.headers["Location"])


async def sign_in(browser: Browser, page, name: str = "alice", password: str = "wonderland"):
    return await browser.post({"op": "sign_in", "name": name, "password": password}, path=form_action(text(page)))


async def test_a_person_signs_in_sees_where_they_go_continues_and_lands_with_a_token(browser, caplog):
    caplog.set_level("INFO")
    page = await start(browser, action="login")
    body = assert_page(page)
    assert "client.example.org" in body and 'type="password"' in body
    assert body.index('value="sign_in"') < body.index('value="deny"')  # the first button signs in
    signed = await sign_in(browser, page)
    assert signed.status == 303 and signed.headers["Location"] == page_url(action="login")
    shown = await browser.follow(signed)
    csp = shown.headers["Content-Security-Policy"]
    assert "form-action 'self' https://client.example.org;" in csp
    body = text(shown)
    assert "Continue to client.example.org" in body and "@alice:localhost" in body
    assert f"<code>{CLIENT}</code>" in body
    assert 'type="password"' not in body
    assert body.index('value="continue"') < body.index('value="deny"')  # continue first, deny second
    done = await browser.post({"op": "continue"}, path=form_action(body))
    assert done.status == 303, done
    landed = done.headers["Location"]
    # The client's own query and fragment kept, the token added to the query.
    assert landed.startswith("https://client.example.org/app/?session=1&loginToken=")
    assert landed.endswith("#/home")
    token = query_of(landed)["loginToken"][0]
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", token)
    assert token not in caplog.text
    assert "sso: alice sent back to client.example.org with a login token" in caplog.text


async def test_a_person_signed_in_on_the_account_page_goes_straight_to_continue(browser):
    await browser.sign_in()
    page = await start(browser)
    body = text(page)  # its CSP lets the form go on to the client: not assert_page's
    assert page.status == 200 and "Continue to client.example.org" in body
    assert 'type="password"' not in body
    # "Not you?" asks for the password again.
    other = await browser.get(path=page_url(prompt="login"))
    assert 'type="password"' in text(other)


async def test_deny_and_cancel_send_nothing_anywhere(browser):
    page = await start(browser)
    cancelled = await browser.post({"op": "deny"}, path=form_action(text(page)))
    assert cancelled.status == 200 and "Location" not in cancelled.headers
    assert "Nothing was sent to" in text(cancelled)
    await browser.sign_in()
    page = await browser.get(path=page_url())
    denied = await browser.post({"op": "deny"}, path=form_action(text(page)))
    assert denied.status == 200 and "Location" not in denied.headers
    assert "the application is not signed in" in text(denied)


async def test_continue_without_a_browser_session_asks_to_sign_in(browser):
    page = await start(browser)
    resp = await browser.post({"op": "continue"}, path=form_action(text(page)))
    assert resp.status == 401 and "Location" not in resp.headers
    assert "Sign in to continue." in text(resp) and 'type="password"' in text(resp)


async def test_a_wrong_password_is_said_on_the_page(browser):
    page = await start(browser)
    resp = await sign_in(browser, page, password="nope")
    assert resp.status == 403 and "Wrong name or password." in text(resp)
    assert "Location" not in resp.headers


async def test_the_page_checks_xsrf(browser):
    page = await start(browser)
    resp = await browser.post({"op": "continue"}, path=form_action(text(page)), xsrf=False)
    assert resp.status == 403 and "Location" not in resp.headers


@pytest.mark.parametrize("url", ["javascript:alert(1)", "https://u:p@client.example.org/", "/relative", ""])
async def test_the_page_reached_directly_with_a_bad_url_is_our_html_error_page(browser, url):
    await browser.sign_in()
    resp = await browser.get(path=page_url(url))
    body = assert_page(resp, 400)
    assert "Nothing was sent" in body and 'value="continue"' not in body
    resp = await browser.post({"op": "continue"}, path=page_url(url))
    assert resp.status == 400 and "Location" not in resp.headers


@pytest.mark.parametrize(
    ("url", "where", "landed", "target"),
    [
        ("im.fluffychat://login", "the application im.fluffychat", "im.fluffychat://login?loginToken=",
         "im.fluffychat:"),
        ("http://127.0.0.1:8123/cb?x=1", "127.0.0.1:8123", "http://127.0.0.1:8123/cb?x=1&loginToken=",
         "http://127.0.0.1:8123"),
        ("myapp:///sso?loginToken=forged", "the application myapp", "myapp:///sso?loginToken=", "myapp:"),
        ("http://[::1]:8123/cb", "[::1]:8123", "http://[::1]:8123/cb?loginToken=", "http:"),
    ],
)
async def test_applications_and_loopback_listeners(browser, url, where, landed, target):
    await browser.sign_in()
    page = await browser.get(path=page_url(url))
    body = text(page)
    assert f"Continue to {where}" in body
    assert f" {target};" in page.headers["Content-Security-Policy"]
    if url.startswith("http://"):
        assert "an application on this device" in body
    done = await browser.post({"op": "continue"}, path=form_action(body))
    assert done.headers["Location"].startswith(landed), done
    assert "forged" not in done.headers["Location"]


async def test_register_is_a_sign_in_saying_no_accounts_are_made_here(browser):
    page = await start(browser, action="register")
    body = text(page)
    assert "Accounts on this server are not made here" in body and 'type="password"' in body
    assert "action=register" in form_action(body)


async def test_from_another_site_the_page_asks_for_itself_again_to_get_its_strict_cookie(browser):
    """A web client's redirect is a cross-site navigation: the browser keeps the page's
    SameSite=Strict cookie back, so the page sends the browser to itself (a same-site
    navigation, which carries it) instead of asking a signed-in person for the password."""
    cross = {"Sec-Fetch-Site": "cross-site"}
    resp = await browser.fetch(page_url(), headers=cross, follow_redirects=False)
    body = assert_page(resp)
    target = page_url().replace("&", "&amp;")
    assert f'<meta http-equiv="refresh" content="0; url={target}">' in body
    assert 'type="password"' not in body and 'value="continue"' not in body
    # The cookie, when a browser does send it, is enough: no detour.
    await browser.sign_in()
    resp = await browser.fetch(page_url(), headers={**cross, **browser._headers()}, follow_redirects=False)
    assert "Continue to client.example.org" in text(resp)
    # Sent by the page itself (same-origin), the sign-in form when there is no browser session.
    resp = await browser.fetch(page_url(), headers={"Sec-Fetch-Site": "same-origin"}, follow_redirects=False)
    assert 'type="password"' in text(resp)
