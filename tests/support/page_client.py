"""A form-filling HTTP client for the account page (cookies, the XSRF token), and the checks
every page passes; shared by the page's HTTP tests."""

from __future__ import annotations

import re
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import urlencode

from tests.support.helpers import Response

PAGE = "/account/"
CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)


def set_cookies(resp: Response) -> dict[str, Any]:
    """The response's Set-Cookie headers, by name (http.cookies.Morsel each)."""
    jar: dict[str, Any] = {}
    for header in resp.headers.get_list("Set-Cookie"):
        parsed: SimpleCookie = SimpleCookie()
        parsed.load(header)
        jar.update(parsed)
    return jar


def text(resp: Response) -> str:
    return resp.body.decode("utf-8")


class Browser:
    """A cookie jar and the page's forms, over the test fetch (redirects not followed)."""

    def __init__(self, fetch: Any) -> None:
        self.fetch = fetch
        self.cookies: dict[str, str] = {}
        self.xsrf = ""

    def _remember(self, resp: Response) -> None:
        for name, morsel in set_cookies(resp).items():
            if not morsel.value:  # cleared
                self.cookies.pop(name, None)
            else:
                self.cookies[name] = morsel.value
        match = re.search(r'name="_xsrf" value="([^"]+)"', text(resp)) if resp.body else None
        if match:
            self.xsrf = match.group(1)

    def _headers(self) -> dict[str, str]:
        return {"Cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items())} if self.cookies else {}

    async def get(self, query: dict[str, str] | None = None, path: str = PAGE) -> Response:
        url = path + ("?" + urlencode(query) if query else "")
        resp = await self.fetch(url, headers=self._headers(), follow_redirects=False)
        self._remember(resp)
        return resp

    async def post(self, fields: dict[str, str], *, xsrf: bool = True, path: str = PAGE) -> Response:
        form = dict(fields)
        if xsrf:
            form["_xsrf"] = self.xsrf
        headers = {**self._headers(), "Content-Type": "application/x-www-form-urlencoded"}
        resp = await self.fetch(path, "POST", body=urlencode(form), headers=headers, follow_redirects=False)
        self._remember(resp)
        return resp

    async def sign_in(self, name: str = "alice", password: str = "wonderland", **extra: str) -> Response:
        if not self.xsrf:
            await self.get()
        return await self.post({"op": "sign_in", "name": name, "password": password, **extra})

    async def follow(self, resp: Response) -> Response:
        assert resp.status == 303, resp
        location = resp.headers["Location"]
        assert location.startswith(PAGE), location
        resp = await self.fetch(location, headers=self._headers(), follow_redirects=False)
        self._remember(resp)
        return resp


def assert_page(resp: Response, status: int = 200, *, script: bool = False) -> str:
    """An HTML page with the page's security headers and no CORS; its text. `script`: a page
    with a passkey button, whose policy adds `script-src 'self'` for webauthn.js alone."""
    assert resp.status == status, resp
    assert resp.headers["Content-Type"] == "text/html; charset=UTF-8", resp
    assert resp.headers["Content-Security-Policy"] == (CSP + "; script-src 'self'" if script else CSP)
    assert resp.headers["X-Frame-Options"] == "DENY"
    assert resp.headers["X-Content-Type-Options"] == "nosniff"
    assert resp.headers["Referrer-Policy"] == "no-referrer"
    assert resp.headers["Cache-Control"] == "no-store"
    assert "Access-Control-Allow-Origin" not in resp.headers
    assert resp.headers.get("X-Request-ID")
    body = text(resp)
    assert body.startswith("<!DOCTYPE html>")
    # Nothing the CSP would block: no script (but webauthn.js from this origin), no inline
    # event handler, no inline style.
    scripts = re.findall(r"<script[^>]*>", body)
    assert scripts == (['<script src="/account/webauthn.js" defer>'] if script else []), scripts
    assert "</script>" not in body.replace("<script src=\"/account/webauthn.js\" defer></script>", "")
    assert not re.search(r"<[^>]*\s(on[a-z]+|style)\s*=", body), body
    return body
