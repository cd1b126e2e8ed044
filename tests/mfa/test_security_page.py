"""The account page's security page (`/account/security`, issue 38) over HTTP: listed from the
menu; an authenticator app added in the interface contract's shape (a link naming it, the
`otpauth://` link, one form with one text input, then each recovery code in its own `<code>`);
a passkey added (py_webauthn checking a software authenticator's answer); a factor removed and
the codes renewed only with the password again or a code; no script but webauthn.js."""

from __future__ import annotations

import asyncio
import re
import threading
from html import unescape
from typing import Any

import pytest
import zxingcpp

from homeserver.mfa import qr
from tests.mfa.authenticator import SoftAuthenticator
from tests.mfa.test_qr import pixels
from tests.oauth_clients.flow import forms_of
from tests.support.helpers import DEFAULT_USERS, record
from tests.support.page_client import Browser, assert_page, text
from tests.support.second_factors import App, add_app

KEY = "an operator's key of at least 32 bytes, for tests"
PAGE = "/account/security"
STEP = "/account/second-step"


@pytest.fixture
def user_records():
    return [dict(r) for r in DEFAULT_USERS] + [record("carol", "sesame", "-c", mfa_required=True)]


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    return {"mfa": {"enabled": True, "key": KEY}}


@pytest.fixture
def browser(fetch) -> Browser:
    return Browser(fetch)


async def signed_in(browser: Browser, name: str = "bob", password: str = "builder", app: App | None = None) -> str:
    """Signed in on the security page's own form (through the second step with `app`); its HTML."""
    page = assert_page(await browser.get(path=PAGE))
    assert f'action="{PAGE}"' in page and 'type="password"' in page
    resp = await browser.post({"op": "sign_in", "name": name, "password": password}, path=PAGE)
    if app is not None:
        assert resp.headers["Location"].startswith(STEP), resp
        step = assert_page(await browser.get(path=resp.headers["Location"]))
        then = unescape(re.search(r'name="then" value="([^"]*)"', step).group(1))
        resp = await browser.post({"op": "code", "code": app.code(), "then": then}, path=STEP)
    assert resp.status == 303 and resp.headers["Location"] == PAGE, resp
    return assert_page(await browser.get(path=PAGE))


async def add_app_on_the_page(browser: Browser, page: str) -> tuple[App, str]:
    """The contract's way: the link naming the app, the otpauth:// link, the one form."""
    link = re.search(r'<a [^>]*href="([^"]+)"[^>]*>([^<]*(?:authenticator|app|TOTP)[^<]*)</a>', page, re.IGNORECASE)
    assert link, page
    adding = assert_page(await browser.get(path=unescape(link.group(1))))
    uri = re.search(r'<a href="(otpauth://totp/[^"]+)"', adding)
    assert uri, adding
    (form,) = forms_of(adding)  # the page's one form
    assert [f[1] for f in form.fields if f[0] == "text"] == ["code"] and form.submits[0] == ("op", "add_app")
    assert "<svg" in adding and "<title>QR code" in adding
    app = App.from_uri(unescape(uri.group(1)))
    assert app.secret in adding.replace(" ", "")  # the secret as text, to type it in
    fields = {name: value for _, name, value in form.fields if name != "_xsrf"}
    resp = await browser.post({**fields, "code": app.code(), "op": "add_app"}, path=PAGE)
    return app, assert_page(resp)


async def test_the_menu_leads_here_and_an_app_is_added_in_the_contracts_shape(hs, browser):
    await browser.sign_in("bob", "builder")
    assert 'href="/account/security"' in assert_page(await browser.get())
    page = assert_page(await browser.get(path=PAGE))
    assert "You have none yet" in page
    _, after = await add_app_on_the_page(browser, page)
    codes = re.findall(r"<code>([^<]+)</code>", after.split('id="recovery-codes"')[1].split("</section>")[0])
    assert len(codes) == 10 and all(re.fullmatch(r"[0-9a-z]{4}-[0-9a-z]{4}-[0-9a-z]{4}", c) for c in codes), codes
    assert "Authenticator app added" in after
    # Shown once: the page again lists the app and how many codes are left, not the codes.
    again = assert_page(await browser.get(path=PAGE))
    assert codes[0] not in again and "10 of your recovery codes" in again
    # This browser's session now counts as having used it: still signed in.
    (opened,) = await hs.browser_sessions.list_open("bob")
    assert opened.second_factor == "totp"
    assert "Your sessions" in assert_page(await browser.get())


async def test_the_add_form_sent_twice_at_once_adds_the_app_once(hs, browser):
    # A double click: both answers are pages (no 500), and one app is kept.
    assert "You have none yet" in await signed_in(browser)
    adding = assert_page(await browser.get(path=PAGE, query={"add": "app"}))
    app = App.from_uri(unescape(re.search(r'<a href="(otpauth://totp/[^"]+)"', adding).group(1)))
    (form,) = forms_of(adding)
    fields = {name: value for _, name, value in form.fields if name != "_xsrf"}
    fields.update(code=app.code(), op="add_app")
    answers = await asyncio.gather(browser.post(fields, path=PAGE), browser.post(fields, path=PAGE))
    assert [resp.status for resp in answers] == [200, 200], answers
    assert all("Authenticator app added" in text(resp) for resp in answers)
    assert [f.kind for f in await hs.second_factors.factors("bob")].count("totp") == 1


async def test_two_tabs_adding_the_first_apps_at_once_keep_both_and_one_set_of_codes(hs, browser, monkeypatch):
    # Two tabs of one browser, each adding an app, sent at once (both past the page's sign-in
    # check before either is added): both apps kept, the recovery codes on one page (the set
    # that works), and the browser still signed in, with one session.
    assert "You have none yet" in await signed_in(browser)
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
    forms = []
    for _ in range(2):
        adding = assert_page(await browser.get(path=PAGE, query={"add": "app"}))
        app = App.from_uri(unescape(re.search(r'<a href="(otpauth://totp/[^"]+)"', adding).group(1)))
        (form,) = forms_of(adding)
        forms.append({**{name: value for _, name, value in form.fields if name != "_xsrf"},
                      "code": app.code(), "op": "add_app"})
    answers = await asyncio.gather(*(browser.post(fields, path=PAGE) for fields in forms))
    assert [resp.status for resp in answers] == [200, 200], answers
    assert all("Authenticator app added" in text(resp) for resp in answers)
    shown = [re.findall(r"<li><code>([^<]+)</code></li>", text(resp)) for resp in answers]
    assert sorted(len(codes) for codes in shown) == [0, 10], shown
    kept = await hs.second_factors.factors("bob")
    assert sorted(f.kind for f in kept) == ["recovery", "totp", "totp"]
    (opened,) = await hs.browser_sessions.list_open("bob")
    assert opened.second_factor == "totp"
    assert "Your sessions" in assert_page(await browser.get())
    codes = max(shown, key=len)
    assert (await hs.second_factors.check_code("bob", codes[0])).recovery_left == 9


async def test_a_wrong_first_code_shows_the_same_app_again(hs, browser):
    page = await signed_in(browser)
    link = re.search(r'href="([^"]*add=app)"', page).group(1)
    adding = assert_page(await browser.get(path=unescape(link)))
    app = App.from_uri(unescape(re.search(r'<a href="(otpauth://totp/[^"]+)"', adding).group(1)))
    pending = unescape(re.search(r'name="pending" value="([^"]+)"', adding).group(1))
    again = assert_page(await browser.post({"op": "add_app", "pending": pending, "code": app.wrong()}, path=PAGE), 403)
    assert app.secret in again.replace(" ", "") and await hs.second_factors.factors("bob") == []


async def test_the_qr_code_is_drawn_off_the_event_loop_and_reads_as_the_link(hs, browser, monkeypatch):
    # The drawing (milliseconds of CPU) is made on a pool's thread, not the event loop's, and
    # the page is as it was: its QR code reads back as the otpauth:// link beside it, and after
    # a wrong first code the same app's page, the same drawing, is shown again.
    drawn_on, draw = [], qr.svg

    def svg(*args: Any, **kwargs: Any) -> str:
        drawn_on.append(threading.get_ident())
        return draw(*args, **kwargs)

    monkeypatch.setattr(qr, "svg", svg)
    await signed_in(browser)
    adding = assert_page(await browser.get(path=PAGE, query={"add": "app"}))
    uri = unescape(re.search(r'<a href="(otpauth://totp/[^"]+)"', adding).group(1))
    drawing = re.search(r'<div class="qr">(<svg .*?</svg>)</div>', adding, re.DOTALL).group(1)
    assert '<title>QR code of the authenticator app link</title>' in drawing
    image, _ = pixels(drawing)
    assert zxingcpp.read_barcode(image, formats=zxingcpp.BarcodeFormat.QRCode).text == uri
    pending = unescape(re.search(r'name="pending" value="([^"]+)"', adding).group(1))
    wrong = await browser.post({"op": "add_app", "pending": pending, "code": App.from_uri(uri).wrong()}, path=PAGE)
    assert drawing in assert_page(wrong, 403)
    assert len(drawn_on) == 2 and threading.get_ident() not in drawn_on, drawn_on


async def test_removing_and_renewing_ask_for_the_password_or_a_code(hs, browser):
    app, codes = await add_app(hs.second_factors, "bob")
    page = await signed_in(browser, app=app)
    factor_id = re.search(r'name="factor_id" value="([^"]+)"', page).group(1)
    assert "Confirm with your password" in assert_page(
        await browser.post({"op": "remove", "factor_id": factor_id}, path=PAGE), 400)
    assert "Wrong password" in assert_page(
        await browser.post({"op": "remove", "factor_id": factor_id, "password": "nope"}, path=PAGE), 403)
    renewed = assert_page(await browser.post({"op": "renew", "password": "builder"}, path=PAGE))
    new_codes = re.findall(r"<li><code>([^<]+)</code></li>", renewed)
    assert len(new_codes) == 10 and codes[0] not in new_codes
    resp = await browser.post({"op": "remove", "factor_id": factor_id, "code": new_codes[0]}, path=PAGE)
    assert resp.status == 303 and resp.headers["Location"] == PAGE
    assert "The second factor is removed" in assert_page(await browser.get(path=PAGE))
    assert await hs.second_factors.factors("bob") == []  # the recovery codes went with the last one


async def test_a_person_who_must_have_one_cannot_remove_the_last(hs, browser):
    app, _ = await add_app(hs.second_factors, "carol")
    page = await signed_in(browser, "carol", "sesame", app=app)
    factor_id = re.search(r'name="factor_id" value="([^"]+)"', page).group(1)
    resp = await browser.post({"op": "remove", "factor_id": factor_id, "password": "sesame"}, path=PAGE)
    assert "add another one" in assert_page(resp, 409)
    assert len(await hs.second_factors.factors("carol")) == 2


async def test_of_two_removals_at_once_by_a_person_who_must_have_one_one_is_refused(hs, browser, monkeypatch):
    # Carol must have a second factor and has two apps; two tabs remove one each, at once (both
    # through the password before either removes): one is removed, the other page refuses, clearly.
    app, _ = await add_app(hs.second_factors, "carol")
    await add_app(hs.second_factors, "carol")
    page = await signed_in(browser, "carol", "sesame", app=app)
    ids = re.findall(r'name="factor_id" value="([^"]+)"', page)
    assert len(ids) == 2, page
    waiting, both_in = [], asyncio.Event()

    async def together(*args: Any) -> None:
        await confirm_password(*args)
        waiting.append(args)
        if len(waiting) == 2:
            both_in.set()
        await both_in.wait()

    confirm_password = hs.account_page.confirm_password
    monkeypatch.setattr(hs.account_page, "confirm_password", together)
    answers = await asyncio.gather(
        *(browser.post({"op": "remove", "factor_id": factor_id, "password": "sesame"}, path=PAGE) for factor_id in ids)
    )
    assert sorted(resp.status for resp in answers) == [303, 409], answers
    refused = next(resp for resp in answers if resp.status == 409)
    assert "add another one" in assert_page(refused, 409)
    assert sorted(f.kind for f in await hs.second_factors.factors("carol")) == ["recovery", "totp"]


async def test_a_passkey_is_added_with_the_script_allowed_on_that_page_only(hs, browser, fetch):
    page = await signed_in(browser)
    assert "script-src" not in (await browser.get(path=PAGE)).headers["Content-Security-Policy"]
    resp = await browser.get({"add": "passkey"}, path=PAGE)
    adding = assert_page(resp, script=True)
    options = unescape(re.search(r'data-webauthn-options="([^"]+)"', adding).group(1))
    assert 'data-webauthn="create"' in adding and "passkey" in adding.lower()
    key = SoftAuthenticator(origin="http://localhost:8008", rp_id="localhost")
    after = assert_page(await browser.post({"op": "add_passkey", "credential": key.create(options)}, path=PAGE))
    assert "Passkey added" in after and len(re.findall(r"<li><code>", after)) == 10
    (passkey, _) = await hs.second_factors.factors("bob")
    assert passkey.kind == "webauthn"
    script = await fetch("/account/webauthn.js")
    assert script.status == 200 and script.headers["Content-Type"].startswith("text/javascript")
    assert script.headers["X-Content-Type-Options"] == "nosniff" and b"navigator.credentials" in script.body
    assert "Add a passkey" in page


async def test_signed_out_it_asks_to_sign_in_and_a_post_changes_nothing(hs, browser):
    page = assert_page(await browser.get(path=PAGE))
    assert "Sign in" in page
    resp = await browser.post({"op": "renew", "password": "builder"}, path=PAGE)
    assert resp.status == 401 and "Sign in to continue" in text(resp)
