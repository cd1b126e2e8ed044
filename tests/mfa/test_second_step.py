"""The browser sign-in's second step over HTTP (issue 38): after the password, a person with a
second factor has a pending sign-in that every page but the second step's reads as signed out;
the second step's page (one text input, no password, no length limit) takes a current code or
a recovery code, once each, limits wrong codes per person, and sends the person back where
they began, signed in; a person who must have a factor and has none adds one there."""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any
from urllib.parse import unquote

import pyotp
import pytest

from tests.oauth_clients.flow import forms_of
from tests.support.helpers import DEFAULT_USERS, record
from tests.support.page_client import Browser, assert_page
from tests.support.second_factors import App, add_app

KEY = "an operator's key of at least 32 bytes, for tests"
STEP = "/account/second-step"


@pytest.fixture
def user_records():
    return [dict(r) for r in DEFAULT_USERS] + [record("carol", "sesame", "-c", mfa_required=True)]


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    return {"mfa": {"enabled": True, "key": KEY, "failed_codes_burst": 3}, "oauth": {"enabled": True},
            "metrics": {"enabled": True}}


@pytest.fixture
def browser(fetch) -> Browser:
    return Browser(fetch)


async def to_second_step(
    browser: Browser, name: str = "alice", password: str = "wonderland", *, script: bool = False, **extra: str
) -> str:
    """Sign in on the account page up to the second step's page; its HTML."""
    resp = await browser.sign_in(name, password, **extra)
    assert resp.status == 303, resp
    location = resp.headers["Location"]
    assert location.startswith(STEP + "?then="), location
    assert "hs_account" not in browser.cookies and "hs_pending" in browser.cookies
    page = await browser.get(path=location)
    return assert_page(page, script=script)


def then_of(html: str) -> str:
    match = re.search(r'name="then" value="([^"]*)"', html)
    assert match, html
    return unquote(match.group(1)).replace("&amp;", "&")


async def code(browser: Browser, html: str, value: str) -> Any:
    return await browser.post({"op": "code", "code": value, "then": then_of(html)}, path=STEP)


def contract_shape(html: str) -> None:
    """The interface contract's second-step page: its first form has one text input and no
    password input, sent by its first submit button; no pattern or length limit."""
    first = forms_of(html)[0]
    texts = [f for f in first.fields if f[0] == "text"]
    assert len(texts) == 1 and not [f for f in first.fields if f[0] == "password"], first
    assert first.submits and first.submits[0] == ("op", "code"), first
    assert "pattern=" not in html and "maxlength" not in html
    assert 'type="password"' not in html


async def test_a_code_finishes_the_sign_in_and_the_browser_session_carries_it(hs, browser):
    app, _ = await add_app(hs.second_factors, "alice")
    html = await to_second_step(browser, action="org.matrix.profile")
    contract_shape(html)
    assert "@alice:localhost" in html and "passkey" not in html.lower()
    # Pending: the account page shows its sign-in, as to anyone signed out.
    assert 'name="password"' in assert_page(await browser.get())
    resp = await code(browser, html, app.code())
    assert resp.status == 303 and resp.headers["Location"] == "/account/?action=org.matrix.profile", resp
    assert "hs_pending" not in browser.cookies and "hs_account" in browser.cookies
    assert "Profile" in assert_page(await browser.get({"action": "org.matrix.profile"}))
    (opened,) = await hs.browser_sessions.list_open("alice")
    assert opened.second_factor == "totp"
    sessions_page = assert_page(await browser.get())
    assert "Authenticator app" in sessions_page


async def test_a_wrong_or_replayed_code_is_refused_and_the_sign_in_stays_pending(hs, browser, fetch):
    app, _ = await add_app(hs.second_factors, "alice")
    html = await to_second_step(browser)
    resp = await code(browser, html, app.wrong())
    page = assert_page(resp, 403)
    assert "not right" in page and "hs_account" not in browser.cookies
    used = app.code()
    assert (await code(browser, html, used)).status == 303
    # Another browser, the same code: refused (a code passes once).
    other = Browser(fetch)
    html = await to_second_step(other)
    assert "used already" in assert_page(await code(other, html, used), 403)
    assert (await code(other, html, app.code())).status == 303


async def test_wrong_codes_are_limited_per_person(hs, browser, caplog):
    app, _ = await add_app(hs.second_factors, "alice")
    html = await to_second_step(browser)
    for _ in range(3):
        assert (await code(browser, html, app.wrong())).status == 403
    resp = await code(browser, html, app.code())  # the right one too, over the limit
    assert "Too many wrong codes" in assert_page(resp, 429) and int(resp.headers["Retry-After"]) > 0
    assert "hs_account" not in browser.cookies
    assert "second_factor" in caplog.text and app.codes[-1] not in caplog.text
    failures = {s.labels["kind"]: s.value for m in hs.metrics.second_factors.collect() for s in m.samples
                if s.name.endswith("_total") and s.labels["outcome"] == "failure"}
    assert failures == {"totp": 3.0}


async def test_wrong_codes_sent_at_once_get_no_more_tries_than_the_limit(hs, browser):
    """Codes sent together (a guesser's parallel requests) are counted as one after another:
    no more of them are tried than the limit lets through, the rest answer 429."""
    app, _ = await add_app(hs.second_factors, "alice")
    html = await to_second_step(browser)
    window = {pyotp.TOTP(app.secret).at((app.step_now() + i) * 30) for i in range(-2, 3)}
    wrong = [c for c in (f"{n:06d}" for n in range(20)) if c not in window][:12]
    answers = await asyncio.gather(*(code(browser, html, guess) for guess in wrong))
    statuses = sorted(resp.status for resp in answers)
    assert statuses.count(403) == 3 and set(statuses) == {403, 429}, statuses


async def test_the_second_steps_address_logs_no_user_code_of_the_page_it_returns_to(hs, browser, caplog):
    # The device page's sign-in returns to its code (`then=/account/device?user_code=...`): the
    # access log redacts the user code there as it does at the top of a query.
    await add_app(hs.second_factors, "alice")
    caplog.set_level(logging.INFO, logger="homeserver.access")
    await browser.get(path="/account/device", query={"user_code": "WDJB-MJHT"})
    resp = await browser.post({"op": "sign_in", "name": "alice", "password": "wonderland", "user_code": "WDJB-MJHT"},
                              path="/account/device")
    assert resp.status == 303 and "WDJB" in unquote(resp.headers["Location"]), resp
    assert_page(await browser.get(path=resp.headers["Location"]))
    logged = [r.getMessage() for r in caplog.records if r.name == "homeserver.access"]
    assert any(STEP in line for line in logged), logged
    assert not [line for line in logged if "WDJB" in unquote(unquote(line))], logged


async def test_a_recovery_code_passes_once_and_says_how_many_are_left(hs, browser, fetch):
    _, codes = await add_app(hs.second_factors, "alice")
    html = await to_second_step(browser)
    resp = await code(browser, html, codes[0].upper().replace("-", " "))
    page = assert_page(resp)
    assert "Recovery code used" in page and "9 left" in page
    # Its Continue form goes on to the page the sign-in began on.
    form = forms_of(page)[0]
    assert form.method == "get" and form.action == "/account/"
    other = Browser(fetch)
    html = await to_second_step(other)
    assert assert_page(await code(other, html, codes[0]), 403)


async def test_a_person_who_must_have_one_adds_an_app_in_the_same_step(hs, browser):
    html = await to_second_step(browser, "carol", "sesame", script=True)
    assert "Add a second factor" in html and 'data-webauthn="create"' in html
    link = re.search(r'<a href="(otpauth://totp/[^"]+)"', html)
    assert link, html
    add = forms_of(html)[0]
    assert [f[1] for f in add.fields if f[0] == "text"] == ["code"] and add.submits[0] == ("op", "add_app")
    pending = dict((n, v) for _, n, v in add.fields)["pending"]
    app = App.from_uri(link.group(1).replace("&amp;", "&"))
    wrong = await browser.post({"op": "add_app", "pending": pending, "code": app.wrong(), "then": then_of(html)}, path=STEP)
    again = assert_page(wrong, 403, script=True)
    assert app.secret in again.replace(" ", "")  # the same app, shown again
    resp = await browser.post({"op": "add_app", "pending": pending, "code": app.code(), "then": then_of(html)}, path=STEP)
    page = assert_page(resp)
    codes = re.findall(r"<li><code>([^<]+)</code></li>", page)
    assert len(codes) == 10, page
    assert "hs_account" in browser.cookies
    assert [f.kind for f in await hs.second_factors.factors("carol")] == ["totp", "recovery"]
    (opened,) = await hs.browser_sessions.list_open("carol")
    assert opened.second_factor == "totp"


async def test_two_tabs_adding_the_first_factor_at_once_show_one_set_of_codes(hs, browser, monkeypatch):
    # Carol's second step open in two tabs, an app added in each at once: both kept, the codes
    # shown on one page (the set that works), the other page says the app was added, with no
    # empty list of codes "shown only now".
    tabs = []
    for _ in range(2):
        html = await to_second_step(browser, "carol", "sesame", script=True)
        app = App.from_uri(re.search(r'<a href="(otpauth://totp/[^"]+)"', html).group(1).replace("&amp;", "&"))
        pending = dict((n, v) for _, n, v in forms_of(html)[0].fields)["pending"]
        tabs.append({"op": "add_app", "pending": pending, "code": app.code(), "then": then_of(html)})
    factors = hs.second_step.factors
    waiting, both_in = [], asyncio.Event()

    async def together(*args: Any) -> Any:
        waiting.append(args)
        if len(waiting) == 2:
            both_in.set()
        await both_in.wait()
        return await finish_totp(*args)

    finish_totp = factors.finish_totp
    monkeypatch.setattr(factors, "finish_totp", together)
    pages = [assert_page(resp) for resp in await asyncio.gather(*(browser.post(tab, path=STEP) for tab in tabs))]
    assert all("Second factor added" in page for page in pages)
    shown = [re.findall(r"<li><code>([^<]+)</code></li>", page) for page in pages]
    assert sorted(len(codes) for codes in shown) == [0, 10], shown
    assert ["Your recovery codes" in page for page in pages].count(True) == 1
    assert sorted(f.kind for f in await hs.second_factors.factors("carol")) == ["recovery", "totp", "totp"]
    codes = max(shown, key=len)
    assert (await hs.second_factors.check_code("carol", codes[0])).recovery_left == 9


async def test_without_a_pending_sign_in_the_page_says_start_again(browser, hs):
    resp = await browser.get({"then": "/account/?action=org.matrix.profile"}, path=STEP)
    page = assert_page(resp)
    assert "Sign in again" in page and 'href="/account/?action=org.matrix.profile"' in page
    # A link elsewhere is never offered.
    page = assert_page(await browser.get({"then": "https://evil.example/"}, path=STEP))
    assert "evil" not in page
    await browser.get()
    assert (await browser.post({"op": "code", "code": "123456"}, path=STEP)).status == 401


async def test_then_goes_only_where_the_sign_in_began(hs, browser):
    app, _ = await add_app(hs.second_factors, "alice")
    await to_second_step(browser, action="org.matrix.profile")
    resp = await browser.post({"op": "code", "code": app.code(), "then": "/account/device"}, path=STEP)
    assert resp.status == 303 and resp.headers["Location"] == "/account/"


async def test_a_browser_session_without_a_second_factor_ends_once_one_is_needed(hs, browser):
    """Opened before the person had a factor (or before [mfa] required): signed out, asked again."""
    assert (await browser.sign_in("bob", "builder")).status == 303  # no factor: signed in at once
    assert "Your sessions" in assert_page(await browser.get())
    await add_app(hs.second_factors, "bob")
    page = assert_page(await browser.get())
    assert "second factor" in page and 'name="password"' in page


async def test_bob_without_a_factor_signs_in_without_a_second_step(browser):
    resp = await browser.sign_in("bob", "builder")
    assert resp.status == 303 and resp.headers["Location"].startswith("/account/?action=")
    assert "hs_account" in browser.cookies and "hs_pending" not in browser.cookies


async def test_a_tampered_pending_cookie_is_no_sign_in(hs, browser):
    await add_app(hs.second_factors, "alice")
    await to_second_step(browser)
    browser.cookies["hs_pending"] = browser.cookies["hs_pending"].replace("a", "b", 1)
    assert "Sign in again" in assert_page(await browser.get(path=STEP))
    assert "hs_pending" not in browser.cookies
