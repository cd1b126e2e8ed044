"""Passkeys end to end (issue 38): `run.py` served at http://localhost:<port> (a secure context;
a relying party cannot be an IP address), headless Chromium with JavaScript on and Selenium's
virtual authenticator (next.md's measured set-up). The person adds a passkey on the security
page, signs in with it at the second step, cannot pass the second step once the authenticator
is gone, signs in with a recovery code instead and removes the passkey."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.mfa.test_webauthn_js import authenticator
from tests.support.browser import chrome
from tests.support.helpers import DEFAULT_USERS, record
from tests.support.servers import ServerProcess

KEY = "an operator's key of at least 32 bytes, for tests"


@pytest.fixture
def server(tmp_path) -> Iterator[ServerProcess]:
    users = [*DEFAULT_USERS, record("frank", "furter", "-f")]
    running = ServerProcess(tmp_path, 1, f'[mfa]\nenabled = true\nkey = "{KEY}"\n', users=users)
    yield running
    running.stop()


def wait_for(driver: Any, check: Any, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}; at {driver.current_url}:\n{body(driver)}"
        time.sleep(0.1)


def body(driver: Any) -> str:
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By

    try:
        return str(driver.find_element(By.TAG_NAME, "body").text)
    except WebDriverException:  # the page changing under the read: nothing yet
        return ""


def sign_in(driver: Any, url: str) -> None:
    """The sign-in form of the page at `url`: frank's name and password, its first button."""
    from selenium.webdriver.common.by import By

    driver.get(url)
    form = driver.find_element(By.CSS_SELECTOR, "form input[type=password]").find_element(By.XPATH, "./ancestor::form")
    form.find_element(By.CSS_SELECTOR, "input[type=text]").send_keys("frank")
    form.find_element(By.CSS_SELECTOR, "input[type=password]").send_keys("furter")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()


def test_a_passkey_is_added_signs_in_and_is_removed(server):
    from selenium.webdriver.common.by import By

    base = f"http://localhost:{server.port}"
    with chrome(javascript=True) as driver:
        authenticator(driver)
        sign_in(driver, base + "/account/security")
        wait_for(driver, lambda: "Add a passkey" in body(driver), "the security page")
        driver.find_element(By.LINK_TEXT, "Add a passkey").click()
        wait_for(driver, lambda: driver.find_elements(By.CSS_SELECTOR, "button[data-webauthn=create]"), "the button")
        driver.find_element(By.CSS_SELECTOR, "button[data-webauthn=create]").click()
        wait_for(driver, lambda: "Passkey added" in body(driver), "the passkey added")
        codes = [c.text for c in driver.find_elements(By.CSS_SELECTOR, "ul.codes code")]
        assert len(codes) == 10 and len(driver.get_credentials()) == 1

        # Signed out (cookies gone), the sign-in's second step offers the passkey, which passes.
        driver.delete_all_cookies()
        sign_in(driver, base + "/account/")
        wait_for(driver, lambda: "Second step" in body(driver), "the second step")
        button = driver.find_element(By.CSS_SELECTOR, "button[data-webauthn=get]")
        assert "passkey" in button.text.lower()
        button.click()
        wait_for(driver, lambda: "Your sessions" in body(driver), "signed in with the passkey")
        assert "Passkey" in body(driver)  # the browser sign-in says which second factor it passed

        # Without the authenticator, the second step cannot be passed.
        driver.remove_virtual_authenticator()
        driver.delete_all_cookies()
        sign_in(driver, base + "/account/")
        wait_for(driver, lambda: "Second step" in body(driver), "the second step again")
        driver.find_element(By.CSS_SELECTOR, "button[data-webauthn=get]").click()
        time.sleep(3)
        assert "/account/second-step" in driver.current_url and "Your sessions" not in body(driver)
        driver.get(base + "/account/")
        assert driver.find_elements(By.CSS_SELECTOR, "input[type=password]"), body(driver)  # signed out

        # A recovery code instead, then the passkey removed with the password.
        driver.delete_all_cookies()
        sign_in(driver, base + "/account/security")
        wait_for(driver, lambda: "Second step" in body(driver), "the second step, for a recovery code")
        field = driver.find_element(By.CSS_SELECTOR, "form input[name=code]")
        field.send_keys(codes[0])
        field.find_element(By.XPATH, "./ancestor::form").find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        wait_for(driver, lambda: "Recovery code used" in body(driver) and "9 left" in body(driver), "the code used")
        driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
        wait_for(driver, lambda: "Your second factors" in body(driver), "back on the security page")
        driver.find_element(By.TAG_NAME, "summary").click()
        driver.find_element(By.CSS_SELECTOR, "input[name=password][id^=remove-password]").send_keys("furter")
        driver.find_element(By.CSS_SELECTOR, "details form button[type=submit]").click()
        wait_for(driver, lambda: "The second factor is removed" in body(driver), "the passkey removed")
        assert "You have none yet" in body(driver)
