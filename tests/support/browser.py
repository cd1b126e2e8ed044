"""A real browser for tests: Debian's chromium and chromium-driver, driven by selenium.

`chrome()` starts a fresh headless Chromium (its own throw-away profile, no network
chatter of its own) or skips the test with the reason, and fails it instead when the `CI`
environment variable is set. `shoot()` saves full-page screenshots at desktop and phone
widths under tests/artifacts/ (git-ignored).
"""

from __future__ import annotations

import base64
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.support.helpers import ci

ARTIFACTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "artifacts")
WIDTHS = {"desktop": 1280, "phone": 390}
CHROMIUM = ("chromium", "chromium-browser")
DRIVER = ("chromedriver", "chromium-driver")


def _find(names: tuple[str, ...]) -> str | None:
    for name in names:
        path = shutil.which(name) or (f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}") else None)
        if path:
            return path
    return None


def missing(reason: str) -> None:
    """Skip on a laptop; fail under CI, where scripts/install-test-services.sh installs it all."""
    if ci():
        pytest.fail(f"{reason} (CI is set: scripts/install-test-services.sh should have installed it)")
    pytest.skip(reason)


@contextmanager
def chrome(*, javascript: bool = False) -> Iterator[Any]:
    """A headless Chromium under selenium; JavaScript off unless asked (the pages need none)."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing("selenium is not installed (pip install -r requirements-dev.txt)")
    binary, driver_path = _find(CHROMIUM), _find(DRIVER)
    if binary is None or driver_path is None:
        missing("chromium and chromium-driver are not installed (scripts/install-test-services.sh)")
    profile = tempfile.mkdtemp(prefix="hs-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--no-first-run",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--user-data-dir={profile}",
        f"--window-size={WIDTHS['desktop']},900",
    ):
        options.add_argument(argument)
    if not javascript:
        options.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def shoot(driver: Any, name: str, folder: str = "account-page") -> list[str]:
    """Full-page PNGs of the current page at each width (DevTools, so no page script runs)."""
    os.makedirs(os.path.join(ARTIFACTS, folder), exist_ok=True)
    paths = []
    for label, width in WIDTHS.items():
        driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": 800, "deviceScaleFactor": 1, "mobile": label == "phone"},
        )
        metrics = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})
        height = int(metrics["cssContentSize"]["height"])
        shot = driver.execute_cdp_cmd(
            "Page.captureScreenshot",
            {
                "format": "png",
                "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": width, "height": max(height, 200), "scale": 1},
            },
        )
        path = os.path.join(ARTIFACTS, folder, f"{name}-{label}.png")
        with open(path, "wb") as fh:
            fh.write(base64.b64decode(shot["data"]))
        paths.append(path)
    driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    return paths


def submitted(driver: Any, element: Any, *keys: str) -> None:
    """Type keys into an element (Enter submits its form), then wait for the next page."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.wait import WebDriverWait

    old = driver.find_element(By.TAG_NAME, "html")
    element.send_keys(*keys)

    def replaced(_: Any) -> bool:
        try:
            old.is_enabled()
        except WebDriverException:
            # Stale, or (mid-navigation) Chromium's "Node ... does not belong to the document".
            return True
        return False

    WebDriverWait(driver, 10).until(replaced)
