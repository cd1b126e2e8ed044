"""A plain-HTTP OAuth 2.0 client of the Matrix API, no browser: discovery, registration, the
authorization code grant with PKCE S256 (the sign-in page's form found in its HTML and
posted with its hidden fields, the XSRF one among them, and its cookies), the token
exchange, refresh and revocation. Only the standard library, so that bench/oauth.py can
use it too.

It follows the interface contract only: every endpoint from
`GET /_matrix/client/v1/auth_metadata`; the sign-in page is an HTML form with one text or
e-mail input for the name and one password input, sent by its first submit button; a page
after it, if any, goes on by its first submit button; for a person with a second factor, the
page after the password has one text input (a current code or a recovery code) and no
password input, sent by its first submit button.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import secrets
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

METADATA = "/_matrix/client/v1/auth_metadata"
WHOAMI = "/_matrix/client/v3/account/whoami"
STABLE = "urn:matrix:client"
UNSTABLE = "urn:matrix:org.matrix.msc2967.client"


@dataclass
class Answer:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"<{self.status} {self.body[:600]!r}>"


def request(url: str, body: bytes | None = None, headers: dict[str, str] | None = None,
            method: str | None = None, timeout: float = 30) -> Answer:
    """One request on a new connection, redirects not followed."""
    parts = urllib.parse.urlsplit(url)
    conn_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = conn_class(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    try:
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        conn.request(method or ("POST" if body is not None else "GET"), target, body=body, headers=headers or {})
        resp = conn.getresponse()
        return Answer(resp.status, resp.headers, resp.read())
    finally:
        conn.close()


def post_form(url: str, fields: dict[str, str], headers: dict[str, str] | None = None) -> Answer:
    return request(url, urllib.parse.urlencode(fields).encode(),
                   {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json",
                    **(headers or {})})


def pkce() -> tuple[str, str]:
    """(verifier, its S256 challenge)."""
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
    return verifier, challenge


def scope(device_id: str, spelling: str = STABLE) -> str:
    return f"{spelling}:api:* {spelling}:device:{device_id}"


# -- the sign-in page, read as a browser would read it --------------------------------------

@dataclass
class Form:
    action: str
    method: str
    fields: list[tuple[str, str, str]] = field(default_factory=list)  # (type, name, value)
    submits: list[tuple[str, str]] = field(default_factory=list)  # (name, value) in document order


class FormParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.forms: list[Form] = []
        self._form: Form | None = None
        self._button: dict[str, str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form":
            self._form = Form(a.get("action", ""), (a.get("method") or "get").lower())
            self.forms.append(self._form)
        elif self._form is None:
            return
        elif tag == "input":
            kind = (a.get("type") or "text").lower()
            if kind in ("submit", "image"):
                self._form.submits.append((a.get("name", ""), a.get("value", "")))
            elif kind in ("checkbox", "radio"):
                if "checked" in a:
                    self._form.fields.append((kind, a.get("name", ""), a.get("value", "on")))
            else:
                self._form.fields.append((kind, a.get("name", ""), a.get("value", "")))
        elif tag == "button":
            if (a.get("type") or "submit").lower() == "submit":
                self._form.submits.append((a.get("name", ""), a.get("value", "")))

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._form = None


def forms_of(html: str) -> list[Form]:
    parser = FormParser()
    parser.feed(html)
    return parser.forms


class SignInError(AssertionError):
    """The sign-in did not reach the client's redirect URI: what was seen instead."""


class FormBrowser:
    """A browser without scripts: a cookie jar on one host, and the pages' forms filled as the contract says."""

    def __init__(self) -> None:
        self.cookies: dict[str, str] = {}
        self.pages: list[Answer] = []

    def _remember(self, answer: Answer) -> None:
        for header in answer.headers.get_all("Set-Cookie") or []:
            pair = header.split(";", 1)[0]
            name, _, value = pair.partition("=")
            if value.strip('"'):
                self.cookies[name.strip()] = value
            else:
                self.cookies.pop(name.strip(), None)

    def fetch(self, url: str, fields: dict[str, str] | None = None) -> Answer:
        headers = {"Cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items())} if self.cookies else {}
        if fields is None:
            answer = request(url, headers=headers)
        else:
            answer = post_form(url, fields, headers)
        self._remember(answer)
        self.pages.append(answer)
        return answer

    def sign_in(self, url: str, name: str, password: str, redirect_uri: str, steps: int = 6,
                code: Callable[[], str] | None = None) -> str:
        """Open the authorization URL, sign in, go on through any confirmation page; the URL
        the server finally redirects to (under `redirect_uri`). `code`: the person's second
        factor, a current code (or a recovery code) for the page after the password."""
        signed = False
        answer = self.fetch(url)
        for _ in range(steps):
            while answer.status in (301, 302, 303, 307):
                location = urllib.parse.urljoin(url, answer.headers["Location"])
                if location.startswith(redirect_uri):
                    return location
                url, answer = location, self.fetch(location)
            if answer.status != 200 or not answer.headers.get("Content-Type", "").startswith("text/html"):
                raise SignInError(f"expected a page or a redirect to {redirect_uri}, got {answer!r}")
            forms = forms_of(answer.body.decode("utf-8", "replace"))
            if not forms:
                raise SignInError(f"a page without a form and no redirect: {answer!r}")
            form = next((f for f in forms if any(kind == "password" for kind, _, _ in f.fields)), forms[0])
            values: dict[str, str] = {}
            second_step = signed and not any(kind == "password" for kind, _, _ in form.fields)
            for kind, field_name, value in form.fields:
                if not field_name:
                    continue
                if kind == "password":
                    value = password
                    signed = True
                elif kind in ("text", "email") and not value:
                    if second_step and code is None:
                        raise SignInError(f"a second step, and no second factor to give: {answer!r}")
                    value = code() if second_step and code is not None else name
                values[field_name] = value
            if form.submits and form.submits[0][0]:
                values[form.submits[0][0]] = form.submits[0][1]
            target = urllib.parse.urljoin(url, form.action or url)
            if form.method == "post":
                answer = self.fetch(target, values)
            else:
                split = urllib.parse.urlsplit(target)
                target = urllib.parse.urlunsplit(split._replace(query=urllib.parse.urlencode(values)))
                answer = self.fetch(target)
            url = target
        raise SignInError(f"no redirect to {redirect_uri} after {steps} pages: {answer!r}")


# -- the client ------------------------------------------------------------------------------

@dataclass
class Tokens:
    access_token: str
    refresh_token: str
    expires_in: int
    scope: str
    answer: dict[str, Any]


class OAuthClient:
    """A native client with a loopback redirect, registered at `base` (the server's URL)."""

    def __init__(self, base: str, redirect_uri: str = "http://127.0.0.1:49152/callback",
                 client_name: str = "plain HTTP test client") -> None:
        self.base = base.rstrip("/")
        self.redirect_uri = redirect_uri
        answer = request(self.base + METADATA)
        assert answer.status == 200, answer
        self.metadata: dict[str, Any] = answer.json
        registration = request(
            self.metadata["registration_endpoint"],
            json.dumps({
                "application_type": "native", "client_name": client_name,
                "client_uri": "https://client.example.org/", "redirect_uris": [redirect_uri],
                "grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"],
                "token_endpoint_auth_method": "none",
            }).encode(),
            {"Content-Type": "application/json", "Accept": "application/json"},
        )
        assert registration.status == 201, registration
        self.client_id: str = registration.json["client_id"]

    def authorization_url(self, device_id: str, state: str, challenge: str, spelling: str = STABLE,
                          response_mode: str = "query") -> str:
        query = {
            "response_type": "code", "response_mode": response_mode, "client_id": self.client_id,
            "redirect_uri": self.redirect_uri, "scope": scope(device_id, spelling), "state": state,
            "code_challenge_method": "S256", "code_challenge": challenge,
        }
        return self.metadata["authorization_endpoint"] + "?" + urllib.parse.urlencode(query)

    def code(self, name: str, password: str, device_id: str, challenge: str,
             spelling: str = STABLE, second_factor: Callable[[], str] | None = None) -> str:
        """Through the sign-in page (and the second step, with `second_factor`'s code) to the
        redirect: the code (state checked)."""
        state = secrets.token_urlsafe(12)
        landed = FormBrowser().sign_in(self.authorization_url(device_id, state, challenge, spelling),
                                       name, password, self.redirect_uri, code=second_factor)
        params = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(landed).query))
        assert params.get("state") == state, landed
        assert "code" in params, landed
        return params["code"]

    def token(self, **fields: str) -> Answer:
        return post_form(self.metadata["token_endpoint"], {"client_id": self.client_id, **fields})

    def exchange(self, code: str, verifier: str) -> Tokens:
        answer = self.token(grant_type="authorization_code", code=code, redirect_uri=self.redirect_uri,
                            code_verifier=verifier)
        return self._tokens(answer)

    def sign_in(self, name: str, password: str, device_id: str | None = None, spelling: str = STABLE,
                second_factor: Callable[[], str] | None = None) -> Tokens:
        """The whole code grant: sign-in page (the second step with `second_factor`), code, token exchange."""
        verifier, challenge = pkce()
        device_id = device_id or secrets.token_hex(5).upper()
        return self.exchange(self.code(name, password, device_id, challenge, spelling, second_factor), verifier)

    def refresh(self, refresh_token: str) -> Tokens:
        return self._tokens(self.token(grant_type="refresh_token", refresh_token=refresh_token))

    def revoke(self, token: str, hint: str | None = None) -> Answer:
        fields = {"token": token, "client_id": self.client_id}
        if hint:
            fields["token_type_hint"] = hint
        return post_form(self.metadata["revocation_endpoint"], fields)

    def whoami(self, access_token: str) -> Answer:
        return request(self.base + WHOAMI, headers={"Authorization": f"Bearer {access_token}"})

    @staticmethod
    def _tokens(answer: Answer) -> Tokens:
        assert answer.status == 200, answer
        body = answer.json
        assert str(body.get("token_type", "")).lower() == "bearer", body
        return Tokens(body["access_token"], body["refresh_token"], int(body["expires_in"]), body["scope"], body)
