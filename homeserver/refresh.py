"""Refresh tokens of the Matrix client API (`POST /refresh`, spec v1.3+): for the password logins
that ask `refresh_token: true` and for the refresh tokens a move carried from Synapse.

Both are grants (homeserver.oauth.grants), as an OAuth sign-in's: one device's session, its
current and previous refresh tokens, its newest access token; of the client `legacy` (the
name MAS's introspection gives its compatibility sessions), so neither endpoint takes the
other's refresh tokens. The one rotation rule is `Grants.refresh`: a lost answer may be
retried with the previous refresh token until the new access token is used; any older one,
or the previous one after that, is a replay, refused, and ends the session. Access tokens
live `[auth] refreshable_token_lifetime` seconds.

Every refusal is 401 M_UNKNOWN_TOKEN with `soft_logout: false`, as the spec's 401 says ("unknown,
or has already been used"): the client must sign in again (Synapse answers a replay 403
M_FORBIDDEN; the spec's answer is taken).
"""

from __future__ import annotations

import secrets
from typing import Any

from backends.base import User
from homeserver.credentials import Credentials
from homeserver.errors import M_FORBIDDEN, MatrixError, invalid_param, missing_param, unknown_token
from homeserver.jsonio import decode_json_object
from homeserver.oauth.errors import OAuthError
from homeserver.oauth.grants import Grants, Issued, SignIn

LEGACY_CLIENT = "legacy"


class LegacyRefresh:
    """Refresh tokens outside OAuth, over a `Grants` whose access tokens live the refreshable lifetime."""

    def __init__(self, grants: Grants, credentials: Credentials) -> None:
        self.grants = grants
        self.credentials = credentials

    @property
    def expires_in_ms(self) -> int:
        return self.grants.lifetime * 1000

    async def refresh(self, body: bytes, client_ip: str) -> dict[str, Any]:
        """POST /refresh: new tokens for a refresh token of a legacy grant."""
        request = decode_json_object(body)
        token = request.get("refresh_token")
        if token is None:
            raise missing_param("refresh_token")
        if not isinstance(token, str):
            raise invalid_param("refresh_token", "a string")
        try:
            issued = await self.grants.refresh(token, client_ip, client_id=LEGACY_CLIENT)
        except OAuthError:
            raise unknown_token("The refresh token is unknown, was used already, or its session has ended") from None
        return self.answer(issued)

    def answer(self, issued: Issued) -> dict[str, Any]:
        return {
            "access_token": issued.access_token,
            "refresh_token": issued.refresh_token,
            "expires_in_ms": self.expires_in_ms,
        }

    async def open(self, user: User, device_id: str, display_name: str | None, client_ip: str) -> Issued:
        """The tokens of a password login that asked for a refresh token: a grant of its device
        (naming a device that has a session replaces it; with delegation Synapse has the device
        first). The login was checked and audited by the caller."""
        fingerprint = self.credentials.of(user)
        sign_in = SignIn(
            user=user.name, device_id=device_id, client_id=LEGACY_CLIENT, client_name=display_name or "", scope="",
            identity_fp=fingerprint.identity, password_fp=fingerprint.password,
        )
        try:
            return await self.grants.open(sign_in, f"login.{secrets.token_hex(8)}", client_ip, via=None)
        except OAuthError as exc:  # the account changed between the check and now
            raise MatrixError(403, M_FORBIDDEN, exc.description) from None
