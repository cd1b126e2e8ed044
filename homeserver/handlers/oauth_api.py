"""The OAuth 2.0 API's JSON endpoints: client registration (RFC 7591), the token endpoint
(RFC 6749), revocation (RFC 7009) and the device authorization endpoint (RFC 8628). Their errors are OAuth's (`error`,
`error_description`), not Matrix's; with `[oauth]` off they are 404 M_UNRECOGNIZED."""

from __future__ import annotations

import logging
from typing import Any

from tornado.web import HTTPError

from homeserver.errors import M_TOO_LARGE, M_UNRECOGNIZED, HTTPProblem, MatrixError, StoreUnavailable, unrecognized
from homeserver.handlers.body import BodyHandler, FormError
from homeserver.jsonio import decode_json_object, encode_json
from homeserver.oauth import OAuth
from homeserver.oauth.errors import INVALID_REQUEST, SERVER_ERROR, TEMPORARILY_UNAVAILABLE, OAuthError
from homeserver.oauth.metadata import (
    DEVICE_AUTHORIZATION_PATH,
    REGISTRATION_PATH,
    REVOCATION_PATH,
    TOKEN_PATH,
    VERIFICATION_PATH,
)

logger = logging.getLogger(__name__)

NO_STORE = (("Cache-Control", "no-store"), ("Pragma", "no-cache"))


class OAuthApiHandler(BodyHandler):
    """OAuth's error bodies; the OAuth service or 404."""

    # An OAuthError is the answer (write_error says it), not a fault to log.
    expected_errors = (HTTPError, OAuthError)

    def set_default_headers(self) -> None:
        super().set_default_headers()
        # RFC 6749 5.1: every answer of these endpoints, errors included, carries tokens or
        # says something of them.
        for name, value in NO_STORE:
            self._headers[name] = value

    def oauth(self) -> OAuth:
        if self.hs.oauth is None:
            raise unrecognized()
        return self.hs.oauth

    def fields(self) -> dict[str, str]:
        """The body's form (BodyHandler.form), one value per field; invalid_request otherwise."""
        try:
            parsed = self.form()
        except FormError:
            raise OAuthError(INVALID_REQUEST, "the body must be a form (application/x-www-form-urlencoded)") from None
        for name, values in parsed.items():
            if len(values) > 1:
                raise OAuthError(INVALID_REQUEST, f"{name} given more than once")
        return {name: values[0] for name, values in parsed.items()}

    def answer(self, body: dict[str, Any], status: int = 200) -> None:
        self.set_status(status)
        self.finish(encode_json(body))

    def problem(self, status_code: int, exc: BaseException | None) -> HTTPProblem:
        """An OAuth error, but the API's 404 when OAuth is off."""
        if isinstance(exc, OAuthError):
            return exc
        if isinstance(exc, MatrixError) and exc.errcode == M_UNRECOGNIZED:
            return exc
        if isinstance(exc, StoreUnavailable):
            return OAuthError(TEMPORARILY_UNAVAILABLE, f"the {exc.store} is unavailable", 503, {"Retry-After": "5"})
        if isinstance(exc, MatrixError):
            error = TEMPORARILY_UNAVAILABLE if exc.status >= 500 else INVALID_REQUEST
            return OAuthError(error, exc.message, exc.status, exc.headers)
        if 400 <= status_code < 500:
            return OAuthError(INVALID_REQUEST, "the request could not be understood", status_code)
        return OAuthError(SERVER_ERROR, "internal server error", 500)


class RegistrationHandler(OAuthApiHandler):
    """POST: register a client (201 with its client_id and the metadata kept)."""

    async def post(self) -> None:
        oauth = self.oauth()
        try:
            body = decode_json_object(self.body_bytes())
        except MatrixError as exc:
            if exc.status >= 500 or exc.errcode == M_TOO_LARGE:
                raise
            raise OAuthError("invalid_client_metadata", "the body must be a JSON object") from None
        self.answer(await oauth.registration.register(body, self.client_ip), 201)


class TokenHandler(OAuthApiHandler):
    """POST: the authorization code and refresh token grants."""

    async def post(self) -> None:
        self.answer(await self.oauth().token.answer(self.fields(), self.client_ip))


class RevocationHandler(OAuthApiHandler):
    """POST: revoke either token of a session (200 whatever the token was)."""

    async def post(self) -> None:
        await self.oauth().revocation.revoke(self.fields())
        self.answer({})


class DeviceAuthorizationHandler(OAuthApiHandler):
    """POST: codes for a program that asks for a sign-in (RFC 8628 3.1, 3.2); the person
    approves it on a page (handlers/oauth_device_pages.py)."""

    async def post(self) -> None:
        oauth = self.oauth()
        verification = self.hs.base_url.rstrip("/") + VERIFICATION_PATH
        self.answer(await oauth.device.authorize(self.fields(), self.client_ip, verification))


ROUTES = [
    (REGISTRATION_PATH, RegistrationHandler),
    (TOKEN_PATH, TokenHandler),
    (REVOCATION_PATH, RevocationHandler),
    (DEVICE_AUTHORIZATION_PATH, DeviceAuthorizationHandler),
]
