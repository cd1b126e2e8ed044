"""Two worker processes on one SQLite session store: a client registered through one is known to
the other, and the sign-in, the exchange, refreshes and a replay work whichever process answers
(each request on a new connection, spread by the kernel)."""

from __future__ import annotations

import http.cookiejar
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from html import unescape
from typing import Any

from tests.oauth.conftest import challenge_of, scope
from tests.support.servers import call

REDIRECT = "http://127.0.0.1/callback"


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def form_post(port: int, path: str, form: dict[str, str]) -> tuple[int, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=urllib.parse.urlencode(form).encode())
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def test_two_processes_share_clients_codes_and_grants(start):
    server = start(processes=2, _extra="[oauth]\nenabled = true\n")
    status, client = call(server.port, "/oauth2/registration", {
        "client_name": "Two", "client_uri": "https://two.example.org/", "application_type": "native", "redirect_uris": [REDIRECT],
    })
    assert status == 201, client
    query = {
        "client_id": client["client_id"], "redirect_uri": REDIRECT, "response_type": "code", "scope": scope("TWOPROCS01"),
        "state": "s", "code_challenge": challenge_of("v" * 43), "code_challenge_method": "S256",
    }
    url = f"http://127.0.0.1:{server.port}/account/authorize?{urllib.parse.urlencode(query)}"
    for _ in range(6):  # the client is known whichever process answers
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert resp.status == 200
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar), NoRedirect)
    with opener.open(url, timeout=10) as resp:
        page = resp.read().decode()
    fields = {unescape(n): unescape(v) for n, v in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page)}
    fields.update(op="sign_in", name="alice", password="wonderland")
    try:
        opener.open(urllib.request.Request(url.split("?")[0], data=urllib.parse.urlencode(fields).encode()), timeout=10)
        raise AssertionError("no redirect")
    except urllib.error.HTTPError as exc:
        assert exc.code == 303
        location = exc.headers["Location"]
    code = urllib.parse.parse_qs(urllib.parse.urlsplit(location).query)["code"][0]
    status, tokens = form_post(server.port, "/oauth2/token", {
        "grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT, "client_id": client["client_id"],
        "code_verifier": "v" * 43,
    })
    assert status == 200, tokens
    first = tokens["refresh_token"]
    for _ in range(4):
        status, tokens = form_post(server.port, "/oauth2/token", {"grant_type": "refresh_token", "refresh_token": tokens["refresh_token"]})
        assert status == 200, tokens
        assert call(server.port, "/_matrix/client/v3/account/whoami", token=tokens["access_token"])[0] == 200
    status, body = form_post(server.port, "/oauth2/token", {"grant_type": "refresh_token", "refresh_token": first})
    assert status == 400 and body["error"] == "invalid_grant"
    status, body = call(server.port, "/_matrix/client/v3/account/whoami", token=tokens["access_token"])
    assert status == 401 and body["errcode"] == "M_UNKNOWN_TOKEN"
