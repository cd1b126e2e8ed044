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


def held_together(monkeypatch, factors: Any, name: str, requests: int = 2) -> Any:
    """Hold the service's `name` (check_code, ...) until every request is in it or answered;
    `answered()` is called as each answer comes (a request that never calls it lets the other on)."""
    waiting, all_in = [], asyncio.Event()
    real = getattr(factors, name)

    async def together(*args: Any) -> Any:
        waiting.append(args)
        if len(waiting) >= requests:
            all_in.set()
        await all_in.wait()
        return await real(*args)

    def answered() -> None:
        waiting.append(None)
        if len(waiting) >= requests:
            all_in.set()

    monkeypatch.setattr(factors, name, together)
    return answered


async def test_a_pending_sign_in_sent_twice_at_once_opens_one_session(hs, browser, monkeypatch):
    # Two tabs, each with a right code (an app's, a recovery code): the sign-in is finished
    # once, the other answer a redirect to where it began, without a second session.
    app, recovery_codes = await add_app(hs.second_factors, "alice")
    html = await to_second_step(browser)
    answered = held_together(monkeypatch, hs.second_step.factors, "check_code")

    async def send(value: str) -> Any:
        try:
            return await browser.post({"op": "code", "code": value, "then": then_of(html)}, path=STEP)
        finally:
            answered()

    answers = await asyncio.gather(send(app.code()), send(recovery_codes[0]))
    statuses = [resp.status for resp in answers]
    assert 303 in statuses and set(statuses) <= {200, 303}, answers  # the recovery code's page, or a redirect
    assert {resp.headers["Location"] for resp in answers if resp.status == 303} == {then_of(html)}
    assert len(await hs.browser_sessions.list_open("alice")) == 1
    assert "Your sessions" in assert_page(await browser.get())
    # Sent again later: a redirect, no session either.
    assert (await code(browser, html, app.code())).status == 303
    assert len(await hs.browser_sessions.list_open("alice")) == 1


async def test_one_code_in_two_sign_ins_at_once_passes_once(hs, fetch, monkeypatch):
    # Two browsers, each with its own pending sign-in, the same code at once: one passes.
    app, _ = await add_app(hs.second_factors, "alice")
    browsers = [Browser(fetch), Browser(fetch)]
    pages = [await to_second_step(b) for b in browsers]
    answered = held_together(monkeypatch, hs.second_step.factors, "check_code")
    used = app.code()

    async def send(b: Browser, html: str) -> Any:
        try:
            return await code(b, html, used)
        finally:
            answered()

    answers = await asyncio.gather(*(send(b, html) for b, html in zip(browsers, pages, strict=True)))
    assert sorted(resp.status for resp in answers) == [303, 403], answers
    assert len(await hs.browser_sessions.list_open("alice")) == 1


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


async def test_wrong_codes_sent_at_once_get_no_more_tries_than_the_limit(hs, fetch):
    """Codes sent together (a guesser's parallel requests) are counted as one after another:
    no more of them are tried than the limit lets through, the rest answer 429."""
    app, _ = await add_app(hs.second_factors, "alice")
    window = {pyotp.TOTP(app.secret).at((app.step_now() + i) * 30) for i in range(-2, 3)}
    wrong = [c for c in (f"{n:06d}" for n in range(20)) if c not in window][:12]
    # Each from its own pending sign-in (one sign-in takes one code at a time).
    browsers = [Browser(fetch) for _ in wrong]
    pages = [await to_second_step(b) for b in browsers]
    answers = await asyncio.gather(*(code(b, html, guess) for b, html, guess in zip(browsers, pages, wrong, strict=True)))
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


async def test_two_tabs_adding_the_first_factor_at_once_finish_the_sign_in_once(hs, browser, monkeypatch):
    # Carol's second step open in two tabs (one pending sign-in: the browser's), an app added in
    # each at once: the sign-in is finished once, by the tab whose app is added, its page showing
    # the codes (the set that works); the other is sent back to where it began, with no second
    # session and no app added that its page did not confirm.
    tabs = []
    for _ in range(2):
        html = await to_second_step(browser, "carol", "sesame", script=True)
        app = App.from_uri(re.search(r'<a href="(otpauth://totp/[^"]+)"', html).group(1).replace("&amp;", "&"))
        pending = dict((n, v) for _, n, v in forms_of(html)[0].fields)["pending"]
        tabs.append({"op": "add_app", "pending": pending, "code": app.code(), "then": then_of(html)})
    answered = held_together(monkeypatch, hs.second_step.factors, "finish_totp")

    async def send(tab: dict[str, str]) -> Any:
        try:
            return await browser.post(tab, path=STEP)
        finally:
            answered()

    answers = sorted(await asyncio.gather(*(send(tab) for tab in tabs)), key=lambda resp: resp.status)
    assert [resp.status for resp in answers] == [200, 303], answers
    assert answers[1].headers["Location"] == tabs[0]["then"]
    page = assert_page(answers[0])
    assert "Second factor added" in page and "Your recovery codes" in page
    codes = re.findall(r"<li><code>([^<]+)</code></li>", page)
    assert len(codes) == 10, page
    assert sorted(f.kind for f in await hs.second_factors.factors("carol")) == ["recovery", "totp"]
    assert len(await hs.browser_sessions.list_open("carol")) == 1
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
