"""The sign-in page in headless Chromium (JavaScript off): its form goes to the client's loopback
redirect with the code (the page's CSP lets the form's redirect through), and a second sign-in
only confirms. The real clients (matrix-js-sdk, oauth4webapi) are tests/oauth_clients/."""

from __future__ import annotations

import http.server
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.handlers.test_account_page_browser import ThreadServer, fill, page_text, press
from tests.oauth.conftest import challenge_of, scope
from tests.support.browser import chrome
from tests.support.servers import call


class Callback(http.server.BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_GET(self) -> None:
        Callback.seen.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"back in the app")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def callback() -> Iterator[int]:
    server = http.server.HTTPServer(("127.0.0.1", 0), Callback)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Callback.seen = []
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def server(make_config) -> Iterator[ThreadServer]:
    running = ThreadServer(make_config({"oauth": {"enabled": True}}))
    running.run(running.hs.delegation.close())  # the account page's fake: no delegation here
    running.hs.delegation = None
    yield running
    running.stop()


def authorize_url(server: ThreadServer, client_id: str, redirect: str, device: str) -> str:
    query = {
        "client_id": client_id, "redirect_uri": redirect, "response_type": "code", "response_mode": "query",
        "scope": scope(device), "state": "xyz", "code_challenge": challenge_of("v" * 43), "code_challenge_method": "S256",
    }
    return f"{server.url}/account/authorize?{urllib.parse.urlencode(query)}"


def test_sign_in_then_confirm_in_chromium(server, callback):
    redirect = f"http://127.0.0.1:{callback}/callback"
    status, client = call(server.port, "/oauth2/registration", {
        "client_name": "Browser App", "client_uri": "https://app.example.org/", "application_type": "native",
        "redirect_uris": ["http://127.0.0.1/callback"],
    })
    assert status == 201, client
    with chrome() as driver:
        driver.get(authorize_url(server, client["client_id"], redirect, "BROWSER001"))
        assert "Browser App" in page_text(driver) and redirect in page_text(driver)
        fill(driver, "name", "alice")
        fill(driver, "password", "wonderland")
        press(driver, "Sign in and continue")
        assert driver.current_url.startswith(redirect + "?code="), driver.current_url
        code = urllib.parse.parse_qs(urllib.parse.urlsplit(driver.current_url).query)["code"][0]
        form = urllib.parse.urlencode({
            "grant_type": "authorization_code", "code": code, "redirect_uri": redirect,
            "client_id": client["client_id"], "code_verifier": "v" * 43,
        }).encode()
        with urllib.request.urlopen(f"{server.url}/oauth2/token", data=form, timeout=10) as resp:
            assert resp.status == 200
        # Signed in on the account page now: the next authorization only asks to confirm.
        driver.get(authorize_url(server, client["client_id"], redirect, "BROWSER002"))
        assert "You are signed in as @alice:localhost" in page_text(driver)
        press(driver, "Continue to Browser App")
        assert driver.current_url.startswith(redirect + "?code="), driver.current_url
    assert len([p for p in Callback.seen if p.startswith("/callback?code=")]) == 2
