"""OAuth clients from npm driven by node, and the person's part of their flows.

The npm packages go into caches inside .venv (as tests/support/js_sdk.py does for matrix-js-sdk);
the scripts of tests/js/ are copied beside them, named by their content. A script prints
`{"authorize": URL, "user": NAME}` when a person must sign in, waits on its loopback
listener for the browser to land there, and prints `{"result": {...}}` last. The person is
either a plain HTTP client posting the sign-in form (tests/oauth_clients/flow.py) or a
headless Chromium (tests/support/browser.py), filling the page as the contract describes it: one
text or e-mail input for the name, one password input, the first submit button; a page
after it goes on by its first submit button. Before a flow, the person may add an
authenticator app in Chromium (`enrol_in_chromium`), whose codes the second step then takes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import pytest

from tests.oauth_clients.flow import FormBrowser, request
from tests.support.helpers import ci
from tests.support.js_sdk import install_js_sdk
from tests.support.second_factors import App

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OAUTH4WEBAPI_MAJOR = 3
# (authorization URL, user) -> the URL the browser landed on (with its fragment, if any).
SignIn = Callable[[str, str], str]
# user -> a current code of their authenticator app (or a recovery code): their second factor.
CodeOf = Callable[[str], str]


def _missing(reason: str) -> None:
    if ci():
        pytest.fail(f"{reason} (CI is set: the OAuth client tests must run)")
    pytest.skip(reason)


def install_oauth4webapi() -> tuple[str, str]:
    """(node, the cache folder holding node_modules/oauth4webapi)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        _missing("node and npm are not installed")
    assert node is not None and npm is not None
    cache = os.path.join(ROOT, ".venv", "js", f"oauth4webapi-{OAUTH4WEBAPI_MAJOR}")
    if not os.path.isdir(os.path.join(cache, "node_modules", "oauth4webapi")):
        os.makedirs(cache, exist_ok=True)
        result = subprocess.run([npm, "install", "--silent", "--prefix", cache, f"oauth4webapi@{OAUTH4WEBAPI_MAJOR}"],
                                capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            _missing(f"npm install oauth4webapi failed: {result.stderr[-300:]}")
    return node, cache


def script_in(cache: str, name: str) -> str:
    """tests/js/<name> copied beside the cache's node_modules (so its imports resolve)."""
    with open(os.path.join(ROOT, "tests", "js", name), "rb") as fh:
        source = fh.read()
    stem, ext = os.path.splitext(name)
    path = os.path.join(cache, f"{stem}-{hashlib.sha256(source).hexdigest()[:12]}{ext}")
    if not os.path.exists(path):
        with open(path, "wb") as fh:
            fh.write(source)
    return path


def oauth4webapi_script() -> tuple[str, str]:
    node, cache = install_oauth4webapi()
    return node, script_in(cache, "oauth4webapi_flow.mjs")


def js_sdk_script() -> tuple[str, str]:
    node, cache = install_js_sdk()
    return node, script_in(cache, "oauth_js_sdk.mjs")


def run_script(
    node: str, script: str, args: list[str], answer: Callable[[dict[str, Any]], str | None], timeout: float = 240
) -> dict[str, Any]:
    """Run a client script, which prints JSON lines: `answer` takes each but the result and may
    give a line back on the script's stdin; the script's result."""
    proc = subprocess.Popen([node, script, *args], cwd=os.path.dirname(script), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    result: dict[str, Any] | None = None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if not line.startswith("{"):
                continue
            message = json.loads(line)
            if "result" in message:
                result = message["result"]
                continue
            reply = answer(message)
            if reply is not None:
                assert proc.stdin is not None
                proc.stdin.write(reply + "\n")
                proc.stdin.flush()
        proc.wait(30)
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stderr = proc.stderr.read() if proc.stderr else ""
        for stream in (proc.stdout, proc.stderr, proc.stdin):
            if stream:
                stream.close()
    assert result is not None, f"{os.path.basename(script)} ended ({proc.returncode}) without a result:\n{stderr[-3000:]}"
    return result


def run_flow(node: str, script: str, args: list[str], sign_in: SignIn, timeout: float = 240) -> dict[str, Any]:
    """Run a flow script; sign the people in as it asks; its result."""

    def answer(message: dict[str, Any]) -> str | None:
        # The landed URL goes back on stdin: a fragment never reaches the listener.
        return sign_in(message["authorize"], message["user"]) if "authorize" in message else None

    return run_script(node, script, args, answer, timeout)


def redirect_of(url: str) -> str:
    """Where a sign-in URL sends the browser back: an OAuth authorization URL's `redirect_uri`,
    or a legacy SSO redirect's `redirectUrl` (MSC3824)."""
    params = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
    return params.get("redirect_uri") or params["redirectUrl"]


def http_person(password_of: Callable[[str], str], code_of: CodeOf | None = None) -> SignIn:
    """The person as a plain HTTP client: the forms posted, the loopback redirect visited;
    `code_of`: their second factor's codes, for the page after the password."""

    def sign_in(url: str, user: str) -> str:
        code = (lambda: code_of(user)) if code_of is not None else None
        landed = FormBrowser().sign_in(url, user, password_of(user), redirect_of(url), code=code)
        answer = request(landed.split("#", 1)[0])
        assert answer.status == 200, answer
        return landed

    return sign_in


def chromium_person(
    driver: Any, password_of: Callable[[str], str], pages: list[str] | None = None, code_of: CodeOf | None = None
) -> SignIn:
    """The person in headless Chromium (JavaScript off: the pages need none). `pages`
    collects the text of every page seen, for the test to check what the person was shown;
    `code_of`: their second factor's codes, typed into the one text input of the page after
    the password (the contract's second step)."""
    from selenium.webdriver.common.by import By

    def first_submit(form: Any) -> Any:
        buttons = form.find_elements(By.CSS_SELECTOR, "button, input[type=submit], input[type=image]")
        submits = [b for b in buttons if b.tag_name != "button" or (b.get_attribute("type") or "submit") == "submit"]
        assert submits, "a form without a submit button"
        return submits[0]

    def sign_in(url: str, user: str) -> str:
        redirect = redirect_of(url)
        # Another person's browser session (a sign-in remembered) must not answer for this one.
        driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
        driver.get(url)
        signed = False
        deadline = time.monotonic() + 60
        while not driver.current_url.startswith(redirect):
            assert time.monotonic() < deadline, f"never reached {redirect}; at {driver.current_url}:\n{body_text()}"
            if pages is not None:
                pages.append(body_text())
            forms = driver.find_elements(By.TAG_NAME, "form")
            assert forms, f"a page without a form at {driver.current_url}:\n{body_text()}"
            form = forms[0]
            if not signed:
                passwords = driver.find_elements(By.CSS_SELECTOR, "form input[type=password]")
                if passwords:
                    form = passwords[0].find_element(By.XPATH, "./ancestor::form")
                    names = form.find_elements(By.CSS_SELECTOR, "input[type=text], input[type=email], input:not([type])")
                    assert len(names) == 1, f"{len(names)} name inputs on the sign-in form"
                    names[0].clear()
                    names[0].send_keys(user)
                    passwords[0].send_keys(password_of(user))
                    signed = True
            elif code_of is not None and not driver.find_elements(By.CSS_SELECTOR, "form input[type=password]"):
                codes = form.find_elements(By.CSS_SELECTOR, "input[type=text]")
                if codes:
                    assert len(codes) == 1, f"{len(codes)} text inputs on the second step's form"
                    codes[0].send_keys(code_of(user))
            before = driver.current_url, driver.page_source
            first_submit(form).click()
            # Wait for the next document (the click navigates; JavaScript is off).
            while (driver.current_url, driver.page_source) == before and time.monotonic() < deadline:
                time.sleep(0.1)
        return str(driver.current_url)

    def body_text() -> str:
        try:
            return str(driver.find_element(By.TAG_NAME, "body").text)[:2000]
        except Exception:
            return driver.page_source[:2000]

    return sign_in


def enrol_in_chromium(driver: Any, base: str, user: str, password: str, pages: list[str]) -> tuple[App, list[str]]:
    """The person adds an authenticator app on the security page, as the contract describes
    it: the link naming the app, the otpauth:// link, the form's one text input and first
    submit button; then the recovery codes, each in its own <code>."""
    from selenium.webdriver.common.by import By

    def go(button: Any) -> None:
        before = driver.page_source
        button.click()
        deadline = time.monotonic() + 30
        while driver.page_source == before and time.monotonic() < deadline:
            time.sleep(0.05)
        pages.append(driver.find_element(By.TAG_NAME, "body").text)

    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    driver.get(base + "/account/security")
    form = driver.find_element(By.CSS_SELECTOR, "form input[type=password]").find_element(By.XPATH, "./ancestor::form")
    form.find_element(By.CSS_SELECTOR, "input[type=text]").send_keys(user)
    form.find_element(By.CSS_SELECTOR, "input[type=password]").send_keys(password)
    go(form.find_element(By.CSS_SELECTOR, "button[type=submit]"))
    links = [a for a in driver.find_elements(By.TAG_NAME, "a")
             if re.search(r"authenticator|\bapp\b|totp", a.text, re.IGNORECASE)]
    assert links, pages[-1]
    links[0].click()
    uri = driver.find_element(By.CSS_SELECTOR, "a[href^='otpauth://totp/']").get_attribute("href")
    app = App.from_uri(uri)
    (form,) = driver.find_elements(By.TAG_NAME, "form")
    (field,) = form.find_elements(By.CSS_SELECTOR, "input[type=text]")
    field.send_keys(app.code())
    go(form.find_elements(By.CSS_SELECTOR, "button[type=submit]")[0])
    codes = [c.text for c in driver.find_elements(By.CSS_SELECTOR, "#recovery-codes ~ ul code, ul.codes code")]
    assert len(codes) == 10, pages[-1]
    return app, codes
