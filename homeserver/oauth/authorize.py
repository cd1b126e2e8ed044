"""The authorization endpoint: its request (RFC 6749 4.1.1, RFC 7636, the Matrix rules), its
answers on the redirect (RFC 6749 4.1.2, 4.1.2.1; OAuth 2.0 Multiple Response Types for
`response_mode`), and the code a signed-in person's consent makes. The page is
homeserver.handlers.oauth_pages.

A request that names no known client, or a redirect URI the client did not register, is
never redirected (RFC 6749 4.1.2.1: the person sees an error page, PageError). Every other
mistake is an error for the client's redirect URI, with its `state` (RedirectError): shown on
a page too, with a link back for a person signed in (RFC 9700 4.11.2; the page handler).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

from backends.base import User
from backends.sessions.oauth import CodeRecord, OAuthStore
from homeserver.credentials import Credentials
from homeserver.errors import PageError
from homeserver.oauth.clients import display_name, form_action_source, redirect_matches
from homeserver.oauth.common import CODE_LIFETIME, PENDING_CLIENT, new_token, now_ms
from homeserver.oauth.errors import INVALID_REQUEST, LOGIN_REQUIRED, UNSUPPORTED_RESPONSE_TYPE, OAuthError
from homeserver.oauth.scopes import Scope, parse_scope
from homeserver.sessions import token_digest

# The parameters the sign-in form carries back (hidden), as the client sent them.
PARAMS = (
    "client_id", "redirect_uri", "response_type", "response_mode", "scope", "state",
    "code_challenge", "code_challenge_method", "prompt", "login_hint",
)
CODE_CHALLENGE = re.compile(r"[A-Za-z0-9._~-]{43,128}")
MAX_STATE = 2048


@dataclass(frozen=True, slots=True)
class Redirect:
    """Where and how the answer goes back to the client."""

    redirect_uri: str
    response_mode: str  # query or fragment
    state: str | None
    issuer: str  # RFC 9207: named in every answer, so a client of several servers knows which one answered

    def url(self, values: dict[str, str]) -> str:
        """The redirect URI with `values` (and `state`, `iss`) in its query or fragment."""
        pairs = dict(values)
        if self.state is not None:
            pairs["state"] = self.state
        pairs["iss"] = self.issuer
        encoded = urlencode(pairs)
        if self.response_mode == "fragment":
            return f"{self.redirect_uri}#{encoded}"
        return f"{self.redirect_uri}{'&' if urlsplit(self.redirect_uri).query else '?'}{encoded}"

    def error(self, error: OAuthError) -> str:
        return self.url({"error": error.error, "error_description": error.description})

    def form_target(self) -> str:
        """The CSP source the sign-in form may be redirected to (the redirect URI's)."""
        return form_action_source(self.redirect_uri)


class RedirectError(Exception):
    """An error for the client's redirect URI (on a page of ours: homeserver.handlers.oauth_pages)."""

    def __init__(self, redirect: Redirect, error: OAuthError, client_name: str = "The application") -> None:
        super().__init__(str(error))
        self.redirect = redirect
        self.error = error
        self.client_name = client_name


@dataclass(frozen=True, slots=True)
class AuthorizationRequest:
    client: dict[str, Any]
    redirect: Redirect
    scope: Scope
    code_challenge: str
    params: dict[str, str]  # as sent, for the form's hidden fields

    @property
    def client_id(self) -> str:
        return str(self.client["client_id"])

    @property
    def client_name(self) -> str:
        return display_name(self.client)

    @property
    def sign_in_asked(self) -> bool:
        """`prompt=login`: the password again, even for someone signed in on the account page."""
        return "login" in self.params.get("prompt", "").split(" ")


def single(params: dict[str, list[str]]) -> dict[str, str]:
    """One value per parameter; a repeated one is a mistake (RFC 6749 3.1)."""
    found: dict[str, str] = {}
    for name in PARAMS:
        values = params.get(name) or []
        if len(values) > 1:
            found.setdefault("_repeated", name)
        if values:
            found[name] = values[0]
    return found


def check_client_and_redirect(params: dict[str, str], client: dict[str, Any] | None, issuer: str) -> Redirect:
    """The client and its redirect URI, or a PageError (no redirect)."""
    if not params.get("client_id"):
        raise PageError(400, "The application did not say who it is (no client_id).")
    if client is None:
        raise PageError(
            400, "This application is not registered here, or its registration expired. Start again from it."
        )
    redirect_uri = params.get("redirect_uri", "")
    if not redirect_uri or not redirect_matches(list(client.get("redirect_uris", [])), redirect_uri):
        raise PageError(400, "The application asked to send you to an address it did not register. Nothing was sent.")
    mode = params.get("response_mode") or "query"
    state = params.get("state")
    if mode not in ("query", "fragment"):
        error = OAuthError(INVALID_REQUEST, "response_mode must be query or fragment")
        raise RedirectError(Redirect(redirect_uri, "query", state, issuer), error, display_name(client))
    return Redirect(redirect_uri, mode, state, issuer)


def parse_authorization(params: dict[str, str], client: dict[str, Any] | None, issuer: str) -> AuthorizationRequest:
    """The checked request: PageError (no client, a redirect URI not registered) or
    RedirectError (everything else, on the client's redirect URI)."""
    redirect = check_client_and_redirect(params, client, issuer)
    assert client is not None

    def refuse(error: str, description: str) -> RedirectError:
        return RedirectError(redirect, OAuthError(error, description), display_name(client))

    if "_repeated" in params:
        raise refuse(INVALID_REQUEST, f"{params['_repeated']} given more than once")
    if redirect.state is not None and len(redirect.state) > MAX_STATE:
        raise refuse(INVALID_REQUEST, "state is too long")
    if params.get("response_type") != "code":
        raise refuse(UNSUPPORTED_RESPONSE_TYPE, "response_type must be code")
    challenge = params.get("code_challenge")
    if not challenge:
        raise refuse(INVALID_REQUEST, "PKCE is required: code_challenge with code_challenge_method S256")
    if params.get("code_challenge_method") != "S256":
        raise refuse(INVALID_REQUEST, "code_challenge_method must be S256 (plain is not supported)")
    if not CODE_CHALLENGE.fullmatch(challenge):
        raise refuse(INVALID_REQUEST, "code_challenge must be the base64url SHA-256 of the code verifier")
    if "none" in params.get("prompt", "").split(" "):
        # Nothing is ever authorized without the person seeing the page.
        raise refuse(LOGIN_REQUIRED, "this server always shows its sign-in or confirmation page")
    try:
        scope = parse_scope(params.get("scope"))
    except OAuthError as exc:
        raise RedirectError(redirect, exc, display_name(client)) from None
    kept = {name: params[name] for name in PARAMS if name in params}
    return AuthorizationRequest(client, redirect, scope, challenge, kept)


class Authorization:
    """GET and POST /account/authorize, without the page: the request checked, the code made."""

    def __init__(self, store: OAuthStore, credentials: Credentials, issuer: str) -> None:
        self.store = store
        self.credentials = credentials
        self.issuer = issuer

    async def request(self, params: dict[str, str]) -> AuthorizationRequest:
        """The checked request (PageError or RedirectError otherwise)."""
        client_id = params.get("client_id")
        client = await self.store.client(client_id) if client_id and len(client_id) <= 64 else None
        return parse_authorization(params, client, self.issuer)

    async def issue_code(self, request: AuthorizationRequest, user: User, *, second_factor: str = "") -> str:
        """A code for the signed-in person (the sign-in was audited by the login service;
        `second_factor`: the one their browser session passed); the URL the browser goes to with it."""
        code = new_token("")
        fingerprint = self.credentials.of(user)
        record = CodeRecord(
            client_id=request.client_id, client_name=request.client_name,
            redirect_uri=request.redirect.redirect_uri, code_challenge=request.code_challenge,
            user=user.name, device_id=request.scope.device_id, scope=request.scope.granted,
            identity_fp=fingerprint.identity, password_fp=fingerprint.password, created_ts=now_ms(),
            second_factor=second_factor,
        )
        await self.store.add_code(token_digest(code), record, CODE_LIFETIME)
        await self.store.touch_client(request.client_id, PENDING_CLIENT)
        return request.redirect.url({"code": code})
