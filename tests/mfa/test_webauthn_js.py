"""homeserver/static/webauthn.js in headless Chromium with Selenium's virtual authenticator:
a passkey added and used through the script, under a CSP that allows only `script-src 'self'`,
each answer verified by the second-factor service (homeserver/mfa/service.py).

The pages are a tiny Tornado app of this test, on a thread, served at http://localhost:<port>
(a secure context; a relying party cannot be an IP address). The CSP reports violations to
the app: a control page with an inline style proves reports arrive, and the script's pages
must cause none.
"""

from __future__ import annotations

import asyncio
import html
import json
import os
import threading
import time
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest
import tornado.web
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from homeserver.mfa import passkeys, qr
from homeserver.mfa.limits import WrongCodeLimit
from homeserver.mfa.passkeys import PasskeyError, RelyingParty
from homeserver.mfa.sealing import Keyring
from homeserver.mfa.service import SecondFactors
from tests.mfa.memory_store import MemoryFactorStore
from tests.support.browser import chrome

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "homeserver", "static", "webauthn.js")
# The account page's policy (homeserver/handlers/page_base.py) with scripts from the page's
# own origin allowed, as the pages with a passkey button will have it, and a report address.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; form-action 'self'; "
       "frame-ancestors 'none'; base-uri 'none'; report-uri /csp-report")
PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<script src="/webauthn.js" defer></script></head>
<body><h1>{title}</h1>{body}
<form method="post" action="{action}">
<input type="hidden" name="credential">
<p data-webauthn-error hidden id="error"></p>
<button type="button" id="go" data-webauthn="{mode}" data-webauthn-options="{options}">Use a passkey</button>
</form></body></html>"""


class Pages:
    """The test's pages over one SecondFactors for "alice", on an event loop in a thread."""

    def __init__(self) -> None:
        self.reports: list[Any] = []
        self.results: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.run(self._start())

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    async def _start(self) -> None:
        sock, self.port = bind_unused_port()
        self.store = MemoryFactorStore()
        self.mfa = SecondFactors(
            self.store, Keyring("k" * 32), WrongCodeLimit(1, 5), issuer="localhost",
            relying_party=RelyingParty.from_base_url(self.url, "localhost"),
        )
        pages = self

        class Page(tornado.web.RequestHandler):
            def set_default_headers(self) -> None:
                self.set_header("Content-Security-Policy", CSP)

            def page(self, title: str, mode: str, options: str, body: str = "") -> None:
                self.write(PAGE.format(title=title, action=self.request.path, mode=mode,
                                       options=html.escape(options, quote=True), body=body))

            def done(self, text: str) -> None:
                pages.results.append(text)
                self.write(f"<!DOCTYPE html><title>done</title><p id='result'>{html.escape(text)}</p>")

        class Register(Page):
            async def get(self) -> None:
                uri = "otpauth://totp/localhost:alice?secret=JBSWY3DPEHPK3PXPJBSWY3DPEHPK3PXP&issuer=localhost"
                self.page("Add a passkey", "create", await pages.mfa.begin_passkey("alice", "Alice"), qr.svg(uri))

            async def post(self) -> None:
                try:
                    added = await pages.mfa.finish_passkey("alice", self.get_body_argument("credential"), "Chromium")
                except PasskeyError as exc:
                    return self.done(f"refused: {exc}")
                self.done(f"added {added.factor.kind} {added.factor.transports} codes={len(added.recovery_codes)}")

        class SignIn(Page):
            async def get(self) -> None:
                options = await pages.mfa.begin_passkey_check("alice")
                self.page("Second step", "get", options or "{}")

            async def post(self) -> None:
                try:
                    passed = await pages.mfa.finish_passkey_check("alice", self.get_body_argument("credential"))
                except PasskeyError as exc:
                    return self.done(f"refused: {exc}")
                self.done(f"passed {passed.kind}")

        class Control(Page):
            def get(self) -> None:
                self.write("<!DOCTYPE html><title>control</title><p style='color: red'>inline style</p>")

        class Report(tornado.web.RequestHandler):
            def check_xsrf_cookie(self) -> None:
                pass

            def post(self) -> None:
                pages.reports.append(json.loads(self.request.body))

        class Script(tornado.web.RequestHandler):
            def get(self) -> None:
                self.set_header("Content-Type", "text/javascript; charset=UTF-8")
                with open(SCRIPT, "rb") as fh:
                    self.write(fh.read())

        app = tornado.web.Application([
            (r"/register", Register), (r"/signin", SignIn), (r"/control", Control), (r"/csp-report", Report),
            (r"/webauthn\.js", Script),
        ])
        self.server = HTTPServer(app)
        self.server.add_sockets([sock])

    @property
    def url(self) -> str:
        return f"http://localhost:{self.port}"

    def stop(self) -> None:
        self.run(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    async def _stop(self) -> None:
        self.server.stop()


@pytest.fixture
def pages() -> Iterator[Pages]:
    running = Pages()
    yield running
    running.stop()


def authenticator(driver: Any) -> None:
    """Chromium's virtual authenticator as next.md measured it: added on about:blank,
    internal transport (a platform authenticator), resident keys and user verification."""
    from selenium.webdriver.common.virtual_authenticator import VirtualAuthenticatorOptions

    driver.get("about:blank")
    options = VirtualAuthenticatorOptions(
        protocol=VirtualAuthenticatorOptions.Protocol.CTAP2,
        transport=VirtualAuthenticatorOptions.Transport.INTERNAL,
        has_resident_key=True, has_user_verification=True, is_user_verified=True,
    )
    driver.add_virtual_authenticator(options)


# Browsers without WebAuthn's JSON helpers (PublicKeyCredential.parse*OptionsFromJSON and
# toJSON(): Chromium before 129, Safari before 18.4, Firefox before 119): the script's own
# conversions then run, so the test takes the helpers away for its "by hand" run.
WITHOUT_JSON_HELPERS = """
delete PublicKeyCredential.parseCreationOptionsFromJSON;
delete PublicKeyCredential.parseRequestOptionsFromJSON;
delete PublicKeyCredential.prototype.toJSON;
return [typeof PublicKeyCredential.parseCreationOptionsFromJSON, typeof PublicKeyCredential.prototype.toJSON];
"""


def press(driver: Any, url: str, by_hand: bool = False) -> None:
    from selenium.webdriver.common.by import By

    driver.get(url)
    if by_hand:
        assert driver.execute_script(WITHOUT_JSON_HELPERS) == ["undefined", "undefined"]
    driver.find_element(By.ID, "go").click()


def result(driver: Any, timeout: float = 15) -> str:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.wait import WebDriverWait

    WebDriverWait(driver, timeout).until(lambda d: d.find_elements(By.ID, "result"))
    return str(driver.find_element(By.ID, "result").text)


@pytest.mark.parametrize("by_hand", [False, True], ids=["json helpers", "by hand"])
def test_a_passkey_is_added_and_used_through_the_script_under_the_csp(pages, by_hand):
    with chrome(javascript=True) as driver:
        # The control: an inline style on a page of this policy is reported, so reports work.
        driver.get(f"{pages.url}/control")
        deadline = time.monotonic() + 10
        while not pages.reports and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pages.reports, "Chromium sent no CSP report for the control page"
        control = len(pages.reports)

        authenticator(driver)
        press(driver, f"{pages.url}/register", by_hand)
        assert result(driver) == "added webauthn ('internal',) codes=10"
        assert len(driver.get_credentials()) == 1

        press(driver, f"{pages.url}/signin", by_hand)
        assert result(driver) == "passed webauthn"
        press(driver, f"{pages.url}/signin", by_hand)  # again: a new challenge, a grown counter
        assert result(driver) == "passed webauthn"

        # Adding the same authenticator again: it is in excludeCredentials, so Chromium says so.
        press(driver, f"{pages.url}/register", by_hand)
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.wait import WebDriverWait

        WebDriverWait(driver, 15).until(lambda d: d.find_element(By.ID, "error").is_displayed())
        assert "added already" in driver.find_element(By.ID, "error").text
        assert driver.find_element(By.ID, "go").is_enabled()

        time.sleep(0.5)  # a report would have been sent at each page's load
        assert len(pages.reports) == control, pages.reports[control:]
    (factor, _) = pages.run(pages.store.factors("alice"))
    assert factor.sign_count == 3, factor  # the virtual authenticator counts its creation and each use


def test_without_the_authenticator_the_second_step_cannot_pass(pages, monkeypatch):
    """After the authenticator is removed, Chromium's credentials.get() waits out the request's
    timeout (next.md): a short one here, then the page says so and submits nothing."""
    monkeypatch.setattr(passkeys, "TIMEOUT_MS", 3000)
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.wait import WebDriverWait

    with chrome(javascript=True) as driver:
        authenticator(driver)
        press(driver, f"{pages.url}/register")
        assert result(driver).startswith("added webauthn")
        driver.remove_virtual_authenticator()
        press(driver, f"{pages.url}/signin")
        WebDriverWait(driver, 20).until(lambda d: d.find_element(By.ID, "error").is_displayed())
        assert "not used" in driver.find_element(By.ID, "error").text
        assert driver.find_element(By.ID, "go").is_enabled()
        assert driver.find_elements(By.ID, "result") == []
    assert pages.results == ["added webauthn ('internal',) codes=10"]


def test_the_script_needs_nothing_the_csp_forbids():
    """No eval or its kin (script-src 'self' without 'unsafe-eval'), no HTML or style written
    from a string (style-src 'self'): the browser test would only see the paths it takes."""
    with open(SCRIPT, encoding="utf-8") as fh:
        source = "".join(line for line in fh if not line.lstrip().startswith("//"))  # its comments name them
    for forbidden in ("eval(", "new Function", "setTimeout(\"", "innerHTML", "outerHTML", "insertAdjacentHTML",
                      "document.write", ".style", "setAttribute(\"style", "javascript:"):
        assert forbidden not in source, forbidden
