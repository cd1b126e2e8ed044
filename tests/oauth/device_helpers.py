"""The device authorization grant driven over HTTP: a program asking for codes and polling, and a
person on the approval page (cookies, XSRF, the forms' first and second buttons)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlencode, urlsplit

from tests.oauth.conftest import OAuthClient, form_fields, scope
from tests.support.helpers import Response
from tests.support.page_client import set_cookies, text

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


class DeviceClient(OAuthClient):
    """A client registered for the device grant (and the code grant, as matrix-js-sdk registers)."""

    async def ensure_client(self) -> str:
        if not self.client_id:
            resp = await self.register(grant_types=["authorization_code", "refresh_token", DEVICE_GRANT])
            assert resp.status == 201, resp
            self.client_id = resp.json["client_id"]
        return self.client_id

    async def ask(self, device: str = "DEVICEDDDD", *, client_ip: str | None = None, **overrides: str) -> Response:
        """A device authorization request (from `client_ip`, as a proxy in front passes it on)."""
        form = {"client_id": await self.ensure_client(), "scope": scope(device), **overrides}
        headers = {**FORM, "X-Forwarded-For": client_ip} if client_ip else FORM
        return await self.fetch(self.path("device_authorization_endpoint"), "POST", body=urlencode(form), headers=headers)

    async def codes(self, device: str = "DEVICEDDDD", **overrides: str) -> dict[str, Any]:
        resp = await self.ask(device, **overrides)
        assert resp.status == 200, resp
        return resp.json

    async def poll(self, device_code: str, **overrides: str) -> Response:
        form = {"grant_type": DEVICE_GRANT, "device_code": device_code, "client_id": self.client_id, **overrides}
        return await self.token(**form)


class Person:
    """A browser on the verification page: its cookies and the last page's forms."""

    def __init__(self, fetch: Any) -> None:
        self.fetch = fetch
        self.cookies: dict[str, str] = {}
        self.page: Response | None = None

    def _headers(self) -> dict[str, str]:
        return {"Cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items())} if self.cookies else {}

    def _remember(self, resp: Response) -> Response:
        for name, morsel in set_cookies(resp).items():
            if morsel.value:
                self.cookies[name] = morsel.value
            else:
                self.cookies.pop(name, None)
        self.page = resp
        return resp

    async def open(self, url: str) -> Response:
        parts = urlsplit(url)
        path = parts.path + ("?" + parts.query if parts.query else "")
        return self._remember(await self.fetch(path, headers=self._headers(), follow_redirects=False))

    async def submit(self, button: int = 0, **fields: str) -> Response:
        """The page's last form sent by its `button`-th submit button, with these fields."""
        assert self.page is not None
        html = text(self.page)
        form_html = html[html.rindex("<form"):]
        form = form_fields(form_html)
        buttons = re.findall(r'<button type="submit" name="([^"]+)" value="([^"]+)"', form_html)
        name, value = buttons[button]
        form[name] = value
        form.update(fields)
        headers = {**self._headers(), **FORM}
        resp = await self.fetch("/account/device", "POST", body=urlencode(form), headers=headers, follow_redirects=False)
        return self._remember(resp)

    async def approve(self, url: str, code: str | None = None, *, allow: bool = True, name: str = "alice",
                      password: str = "wonderland") -> Response:
        """Open `url`, sign in if asked, type `code` if asked, then allow (or deny)."""
        page = await self.open(url)
        if 'type="password"' in text(page):
            page = await self.submit(name=name, password=password)
        if 'name="op" value="code"' in text(page):
            assert code is not None, text(page)
            page = await self.submit(user_code=code)
        assert page.status == 200 and 'value="allow"' in text(page), text(page)
        return await self.submit(0 if allow else 1)
