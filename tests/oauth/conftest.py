"""A small OAuth 2.0 client over the test fetch: registration, the sign-in page (cookies, XSRF,
its forms), the code grant with PKCE, refresh and revocation, as a browser and a Matrix client
would drive them."""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
from html import unescape
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest

from tests.support.helpers import Response
from tests.support.page_client import set_cookies, text

STABLE = "urn:matrix:client:"
UNSTABLE = "urn:matrix:org.matrix.msc2967.client:"
REDIRECT = "http://127.0.0.1/callback"


def scope(device: str, prefix: str = STABLE) -> str:
    return f"{prefix}api:* {prefix}device:{device}"


def challenge_of(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


def form_fields(html: str) -> dict[str, str]:
    """The hidden fields of the page's form, unescaped."""
    return {unescape(n): unescape(v) for n, v in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', html)}


class OAuthClient:
    """One client (registered on first use) and one browser (its cookies)."""

    def __init__(self, fetch: Any) -> None:
        self.fetch = fetch
        self.cookies: dict[str, str] = {}
        self.client_id = ""
        self.metadata: dict[str, Any] = {}

    async def discover(self) -> dict[str, Any]:
        resp = await self.fetch("/_matrix/client/v1/auth_metadata")
        assert resp.status == 200, resp
        self.metadata = resp.json
        return self.metadata

    def path(self, endpoint: str) -> str:
        return urlsplit(self.metadata[endpoint]).path

    async def register(self, **overrides: Any) -> Response:
        if not self.metadata:
            await self.discover()
        body = {
            "client_name": "Test App", "client_uri": "https://app.example.org/", "application_type": "native",
            "redirect_uris": [REDIRECT], "token_endpoint_auth_method": "none",
            "grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"],
        }
        body.update(overrides)
        return await self.fetch(self.path("registration_endpoint"), "POST", json_body=body)

    async def register_from(self, client_ip: str, **overrides: Any) -> Response:
        """A registration as a proxy in front passes it on from `client_ip` (X-Forwarded-For)."""
        if not self.metadata:
            await self.discover()
        body = {"client_name": "Test App", "client_uri": "https://app.example.org/", "application_type": "native",
                "redirect_uris": [REDIRECT], **overrides}
        return await self.fetch(self.path("registration_endpoint"), "POST", json_body=body,
                                headers={"X-Forwarded-For": client_ip})

    async def ensure_client(self) -> str:
        if not self.client_id:
            resp = await self.register()
            assert resp.status == 201, resp
            self.client_id = resp.json["client_id"]
        return self.client_id

    def _headers(self) -> dict[str, str]:
        return {"Cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items())} if self.cookies else {}

    def _remember(self, resp: Response) -> None:
        for name, morsel in set_cookies(resp).items():
            if morsel.value:
                self.cookies[name] = morsel.value
            else:
                self.cookies.pop(name, None)

    async def authorize_page(self, params: dict[str, str]) -> Response:
        resp = await self.fetch(self.path("authorization_endpoint") + "?" + urlencode(params), headers=self._headers(), follow_redirects=False)
        self._remember(resp)
        return resp

    async def params(self, device: str = "DEVICEAAAA", verifier: str | None = None, **extra: str) -> dict[str, str]:
        params = {
            "client_id": await self.ensure_client(), "redirect_uri": REDIRECT, "response_type": "code",
            "scope": scope(device), "state": "st-" + secrets.token_hex(4),
            "code_challenge": challenge_of(verifier or "v" * 43), "code_challenge_method": "S256",
        }
        params.update(extra)
        return {k: v for k, v in params.items() if v is not None}

    async def submit(self, page: Response, **fields: str) -> Response:
        """Send the page's form with these fields (the XSRF token and hidden fields kept)."""
        form = form_fields(text(page))
        form.update(fields)
        headers = {**self._headers(), "Content-Type": "application/x-www-form-urlencoded"}
        resp = await self.fetch(self.path("authorization_endpoint"), "POST", body=urlencode(form), headers=headers, follow_redirects=False)
        self._remember(resp)
        return resp

    async def sign_in(self, params: dict[str, str], name: str = "alice", password: str = "wonderland") -> Response:
        page = await self.authorize_page(params)
        assert page.status == 200, page
        resp = await self.submit(page, op="sign_in", name=name, password=password)
        if resp.status == 200 and 'value="confirm"' in text(resp):
            # The device named has a session, which this replaces: the page says so first, and
            # goes on by its first button (as the interface contract's sign-in pages do).
            resp = await self.submit(resp, op="confirm")
        return resp

    async def code(self, device: str = "DEVICEAAAA", verifier: str = "v" * 43, **extra: str) -> tuple[str, dict[str, str]]:
        params = await self.params(device, verifier, **extra)
        resp = await self.sign_in(params)
        assert resp.status == 303, resp
        answer = redirect_values(resp.headers["Location"])
        assert answer["state"] == params["state"] and "code" in answer, answer
        return answer["code"], params

    async def token(self, **form: str) -> Response:
        return await self.fetch(self.path("token_endpoint"), "POST", body=urlencode(form), headers={"Content-Type": "application/x-www-form-urlencoded"})

    async def exchange(self, code: str, verifier: str = "v" * 43, **extra: str) -> Response:
        return await self.token(grant_type="authorization_code", code=code, redirect_uri=REDIRECT, client_id=self.client_id, code_verifier=verifier, **extra)

    async def login(self, device: str = "DEVICEAAAA", **extra: str) -> dict[str, Any]:
        code, _ = await self.code(device, **extra)
        resp = await self.exchange(code)
        assert resp.status == 200, resp
        return resp.json

    async def refresh(self, refresh_token: str) -> Response:
        return await self.token(grant_type="refresh_token", refresh_token=refresh_token, client_id=self.client_id)

    async def revoke(self, token: str, **extra: str) -> Response:
        return await self.fetch(self.path("revocation_endpoint"), "POST", body=urlencode({"token": token, **extra}), headers={"Content-Type": "application/x-www-form-urlencoded"})


def redirect_values(location: str) -> dict[str, str]:
    """The values on a redirect to the client: from the query or the fragment."""
    parts = urlsplit(location)
    return {k: v[0] for k, v in parse_qs(parts.fragment or parts.query).items()}


@pytest.fixture
def config_overrides() -> dict[str, dict[str, Any]]:
    return {"oauth": {"enabled": True}}


@pytest.fixture
def client(fetch) -> OAuthClient:
    return OAuthClient(fetch)
