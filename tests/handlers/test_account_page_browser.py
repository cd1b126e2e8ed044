"""The account page in a real browser (headless Chromium, JavaScript off), with screenshots.

The server runs in a thread of this process (its own event loop), so the test can give it
a delegation that calls an in-process fake Synapse; Matrix clients log in over HTTP first.
Screenshots of every page at desktop and phone widths land in tests/artifacts/account-page/.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from homeserver.app import make_app
from homeserver.context import HomeServer, build_homeserver, create_backend, create_session_store
from tests.support.browser import chrome, shoot, submitted
from tests.support.fake_synapse import Calls, serve_fake
from tests.support.servers import call

WHOAMI = "/_matrix/client/v3/account/whoami"


class ThreadServer:
    """The app and a fake Synapse on an event loop in a thread, so the test's blocking
    selenium calls and the server run side by side."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.calls = Calls()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.run(self._start())

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    async def _start(self) -> None:
        backend = create_backend(self.config)
        await backend.start()
        store = create_session_store(self.config)
        await store.start()
        self.hs: HomeServer = build_homeserver(self.config, backend, store)
        sock, self.port = bind_unused_port()
        self.server = HTTPServer(make_app(self.hs))
        self.server.add_sockets([sock])
        self.synapse = serve_fake(self.hs, self.calls)

    async def _stop(self) -> None:
        self.server.stop()
        self.synapse.stop()
        await self.hs.close()

    def stop(self) -> None:
        self.run(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def call(self, path: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
        return call(self.port, path, body, token)

    def login(self, device_id: str, name: str) -> str:
        status, body = self.call(
            "/_matrix/client/v3/login",
            {
                "type": "m.login.password",
                "identifier": {"type": "m.id.user", "user": "alice"},
                "password": "wonderland",
                "device_id": device_id,
                "initial_device_display_name": name,
            },
        )
        assert status == 200, body
        return str(body["access_token"])


@pytest.fixture
def server(config) -> Iterator[ThreadServer]:
    running = ThreadServer(config)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    with chrome() as browser:
        yield browser


def fill(driver: Any, field_id: str, value: str) -> None:
    from selenium.webdriver.common.by import By

    element = driver.find_element(By.ID, field_id)
    element.clear()
    element.send_keys(value)


def press(driver: Any, label: str) -> None:
    """Activate the button with this text from the keyboard (focus it, then Enter)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    buttons = [b for b in driver.find_elements(By.TAG_NAME, "button") if b.text.strip() == label]
    assert buttons, f"no button {label!r} in {driver.page_source[:2000]}"
    submitted(driver, buttons[0], Keys.ENTER)


def page_text(driver: Any) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.TAG_NAME, "body").text)


def test_a_person_manages_their_sessions(server, driver):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    phone = server.login("PHONE", "Alice's phone")
    laptop = server.login("LAPTOP", "Laptop")
    driver.delete_all_cookies()

    # Element's link: straight to an action; the page asks to sign in first.
    driver.get(server.url + "/account/?action=org.matrix.sessions_list")
    assert driver.find_element(By.TAG_NAME, "h1").text == "Sign in"
    # The name field has its label, and the page tells no JavaScript to run.
    assert driver.find_element(By.CSS_SELECTOR, "label[for=name]").text == "Name or e-mail address"
    # The stylesheet loads under the page's CSP (the button has its colour, not the browser's grey).
    button = driver.find_element(By.CSS_SELECTOR, "button[type=submit]")
    assert button.value_of_css_property("background-color") == "rgba(11, 87, 208, 1)"
    shoot(driver, "01-sign-in")

    fill(driver, "name", "alice")
    fill(driver, "password", "not-the-password")
    submitted(driver, driver.find_element(By.ID, "password"), Keys.ENTER)
    assert "Wrong name or password." in page_text(driver)
    shoot(driver, "02-sign-in-wrong-password")

    fill(driver, "name", "alice")
    fill(driver, "password", "wonderland")
    submitted(driver, driver.find_element(By.ID, "password"), Keys.ENTER)
    assert driver.find_element(By.TAG_NAME, "h1").text == "Your sessions"
    text = page_text(driver)
    assert "Alice's phone" in text and "PHONE" in text and "Laptop" in text and "LAPTOP" in text
    assert "This browser" in text
    cookies = {c["name"]: c for c in driver.get_cookies()}
    assert cookies["hs_account"]["httpOnly"] and cookies["hs_account"]["sameSite"] == "Strict"
    shoot(driver, "03-sessions")

    # Rename the laptop from its own page.
    driver.find_element(By.LINK_TEXT, "Laptop").click()
    assert driver.find_element(By.TAG_NAME, "h1").text == "Laptop"
    shoot(driver, "04-session")
    fill(driver, "display_name", "Work laptop")
    press(driver, "Rename")
    assert "The session is renamed." in page_text(driver)
    assert driver.find_element(By.TAG_NAME, "h1").text == "Work laptop"
    status, device = server.call("/_matrix/client/v3/devices/LAPTOP", token=laptop)
    assert status == 200 and device["display_name"] == "Work laptop"

    # Element's "sign out this session" link: a confirmation, then the session ends.
    driver.get(server.url + "/account/?action=org.matrix.session_end&device_id=PHONE")
    assert driver.find_element(By.TAG_NAME, "h1").text == "Sign out a session?"
    shoot(driver, "05-session-end")
    press(driver, "Sign out this session")
    assert "The session is signed out." in page_text(driver)
    assert "PHONE" not in page_text(driver)
    status, body = server.call(WHOAMI, token=phone)
    assert status == 401 and body["errcode"] == "M_UNKNOWN_TOKEN"
    assert server.call(WHOAMI, token=laptop)[0] == 200
    shoot(driver, "06-sessions-after-end")

    # The profile, read only, as GET /profile shows it.
    driver.find_element(By.LINK_TEXT, "Profile").click()
    assert "Alice [alice]" in page_text(driver)
    assert "@alice:localhost" in page_text(driver)
    assert not driver.find_elements(By.CSS_SELECTOR, "main input")
    shoot(driver, "07-profile")

    # Approve a cross-signing reset: the password again, then Synapse is asked.
    driver.find_element(By.LINK_TEXT, "Reset cross-signing").click()
    assert "10 minutes" in page_text(driver)
    shoot(driver, "08-cross-signing-reset")
    fill(driver, "password-reset", "wonderland")
    press(driver, "Approve the reset")
    assert "For the next 10 minutes your Matrix client may reset" in page_text(driver)
    assert server.calls.received == [("allow_cross_signing_reset", {"localpart": "alice"})]
    shoot(driver, "09-cross-signing-approved")

    # Unknown action: the sessions list. Then sign out of the page.
    driver.get(server.url + "/account/?action=org.example.nothing")
    assert driver.find_element(By.TAG_NAME, "h1").text == "Your sessions"
    press(driver, "Sign out of this page")
    assert driver.find_element(By.TAG_NAME, "h1").text == "Sign in"
    assert "You are signed out of this page." in page_text(driver)
    assert "hs_account" not in {c["name"] for c in driver.get_cookies()}
    shoot(driver, "10-signed-out")
    # The Matrix session of the laptop is untouched.
    assert server.call(WHOAMI, token=laptop)[0] == 200


def test_sign_out_everywhere_and_keyboard_only(server, driver):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    tokens = [server.login("PHONE", "Phone"), server.login("TABLET", "Tablet")]
    driver.delete_all_cookies()
    driver.get(server.url + "/account/")
    # Keyboard only: the name field has the focus on arrival; Tab, Enter do the rest.
    # (autofocus is applied once the page is rendered: wait for it rather than race it)
    from selenium.webdriver.support.wait import WebDriverWait

    WebDriverWait(driver, 10).until(lambda d: d.switch_to.active_element.get_attribute("id") == "name")
    active = driver.switch_to.active_element
    submitted(driver, active, "alice", Keys.TAB, "wonderland", Keys.ENTER)
    assert driver.find_element(By.TAG_NAME, "h1").text == "Your sessions"

    fill(driver, "password-everywhere", "wrong")
    press(driver, "Sign out everywhere")
    assert "Wrong password." in page_text(driver)
    assert all(server.call(WHOAMI, token=t)[0] == 200 for t in tokens)
    shoot(driver, "11-everywhere-wrong-password")

    fill(driver, "password-everywhere", "wonderland")
    press(driver, "Sign out everywhere")
    assert driver.find_element(By.TAG_NAME, "h1").text == "Sign in"
    assert "Every session of your account has ended" in page_text(driver)
    assert all(server.call(WHOAMI, token=t)[0] == 401 for t in tokens)
    shoot(driver, "12-signed-out-everywhere")


def test_a_framing_page_cannot_show_it(server, driver, tmp_path):
    """frame-ancestors 'none': a page of another origin framing /account/ gets nothing."""
    from selenium.webdriver.common.by import By

    outer = tmp_path / "frame.html"
    outer.write_text(f'<!DOCTYPE html><iframe id="f" src="{server.url}/account/"></iframe>')
    driver.get(outer.as_uri())
    frame = driver.find_element(By.ID, "f")
    driver.switch_to.frame(frame)
    try:
        assert "Sign in" not in driver.page_source
    finally:
        driver.switch_to.default_content()


# -- an accessibility check (axe-core, the engine of Lighthouse's accessibility audit) --------

# axe-core's current major (`npm view axe-core version` gave 4.14.1), cached inside .venv.
AXE_MAJOR = 4


@pytest.fixture(scope="module")
def axe_source() -> str:
    import os
    import shutil
    import subprocess

    from tests.support.browser import missing

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cache = os.path.join(root, ".venv", "js", f"axe-core-{AXE_MAJOR}")
    path = os.path.join(cache, "node_modules", "axe-core", "axe.min.js")
    if not os.path.exists(path):
        npm = shutil.which("npm")
        if npm is None:
            missing("npm is not installed (it installs axe-core for the accessibility check)")
        os.makedirs(cache, exist_ok=True)
        result = subprocess.run(
            [str(npm), "install", "--silent", "--prefix", cache, f"axe-core@{AXE_MAJOR}"],
            capture_output=True, text=True, timeout=300,
        )
        if result.returncode != 0:
            missing(f"npm install axe-core failed: {result.stderr[-300:]}")
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def axe_violations(driver: Any, source: str) -> list[dict[str, Any]]:
    """Run axe-core's WCAG 2.x A and AA rules on the current page, through DevTools (the
    page's CSP forbids any script of its own); the violations, each with its nodes."""
    driver.execute_cdp_cmd("Runtime.evaluate", {"expression": source})
    result = driver.execute_cdp_cmd(
        "Runtime.evaluate",
        {
            "expression": (
                "axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa']}})"
                ".then(r => r.violations.map(v => ({id: v.id, help: v.help, nodes: v.nodes.map(n => n.html)})))"
            ),
            "awaitPromise": True,
            "returnByValue": True,
        },
    )
    return list(result["result"]["value"])


def test_every_page_passes_an_accessibility_check(server, axe_source, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    server.login("PHONE", "Phone")
    pages = [
        "/account/?action=org.matrix.sessions_list",
        "/account/?action=org.matrix.session_view&device_id=PHONE",
        "/account/?action=org.matrix.session_end&device_id=PHONE",
        "/account/?action=org.matrix.session_view&device_id=NOT-THERE",
        "/account/?action=org.matrix.profile",
        "/account/?action=org.matrix.cross_signing_reset",
        "/account/nothing-here",
    ]
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><body><input type="text"><p style="color:#bbb">faint</p></body></html>')
    with chrome(javascript=True) as driver:
        # The check itself works: a page without a language, a label or contrast fails it.
        driver.get(bad.as_uri())
        assert {v["id"] for v in axe_violations(driver, axe_source)} >= {"html-has-lang", "label", "color-contrast"}
        driver.get(server.url + "/account/")
        found = {"sign in": axe_violations(driver, axe_source)}
        fill(driver, "name", "alice")
        fill(driver, "password", "wrong")
        submitted(driver, driver.find_element(By.ID, "password"), Keys.ENTER)
        found["sign in, wrong password"] = axe_violations(driver, axe_source)
        fill(driver, "name", "alice")
        fill(driver, "password", "wonderland")
        submitted(driver, driver.find_element(By.ID, "password"), Keys.ENTER)
        for path in pages:
            driver.get(server.url + path)
            found[path] = axe_violations(driver, axe_source)
    assert {page: v for page, v in found.items() if v} == {}
