"""The token endpoint (RFC 6749 section 3.2): the authorization code grant (with PKCE, RFC 7636),
the refresh token grant and the device code grant (RFC 8628, homeserver.oauth.device); every
answer is RFC 6749 5.1's, every refusal 5.2's. The grants themselves are homeserver.oauth.grants.

- A code is used once; a second use is `invalid_grant` and ends the session the first made.
  When its tokens could not be made for a while (Synapse or a store away: 503), the code
  stands for the client's retry.
- The code must come back with its client, its redirect URI and the PKCE verifier of its
  challenge (S256).
- Refresh rotates (homeserver.oauth.grants: the lost answer retried, a replay ends the session).
"""

from __future__ import annotations

import contextlib
import logging
import re
from typing import Any

from backends.base import StoreUnavailable
from backends.sessions.oauth import OAuthStore
from homeserver.errors import MatrixError
from homeserver.oauth.common import MAX_TOKEN, pkce_s256, same_text
from homeserver.oauth.device import DeviceFlow
from homeserver.oauth.errors import UNSUPPORTED_GRANT_TYPE, OAuthError, invalid_grant, invalid_request
from homeserver.oauth.grants import Grants, Issued, SignIn
from homeserver.oauth.metadata import DEVICE_CODE_GRANT
from homeserver.sessions import REVOKED, token_digest

logger = logging.getLogger(__name__)

CODE_VERIFIER = re.compile(r"[A-Za-z0-9._~-]{43,128}")


def field(form: dict[str, str], name: str) -> str:
    """A required field of a form; invalid_request when missing or empty."""
    value = form.get(name, "")
    if not value:
        raise invalid_request(f"{name} is required")
    return value


def made_by(grant_id: str, base: str) -> bool:
    """Whether a grant id is one Grants.open made for this base id (one of its attempts)."""
    return grant_id.partition(".")[0] == base


class TokenEndpoint:
    """POST /oauth2/token: a form in, the tokens (or an OAuthError) out."""

    def __init__(self, store: OAuthStore, grants: Grants, device: DeviceFlow) -> None:
        self.store = store
        self.grants = grants
        self.device = device

    async def answer(self, form: dict[str, str], client_ip: str) -> dict[str, Any]:
        grant_type = form.get("grant_type", "")
        if grant_type == "authorization_code":
            issued = await self.exchange_code(form, client_ip)
        elif grant_type == "refresh_token":
            issued = await self.grants.refresh(field(form, "refresh_token"), client_ip, client_id=form.get("client_id"))
        elif grant_type == DEVICE_CODE_GRANT:
            issued = await self.device.poll(form, client_ip)
        elif not grant_type:
            raise invalid_request("grant_type is required")
        else:
            raise OAuthError(UNSUPPORTED_GRANT_TYPE, f"grant_type {grant_type!r} is not supported")
        return {
            "access_token": issued.access_token,
            "token_type": "Bearer",
            "expires_in": self.grants.lifetime,
            "refresh_token": issued.refresh_token,
            "scope": issued.grant.scope,
        }

    async def exchange_code(self, form: dict[str, str], client_ip: str) -> Issued:
        store = self.store
        code = field(form, "code")
        client_id = field(form, "client_id")
        redirect_uri = field(form, "redirect_uri")
        verifier = field(form, "code_verifier")
        code_hash = token_digest(code)
        taken = await store.take_code(code_hash) if len(code) <= MAX_TOKEN else None
        if taken is None:
            raise invalid_grant("the code is unknown or expired")
        record, uses = taken
        base_id = "c" + code_hash[:31]  # what this code makes, found again by a second use
        if uses > 1:
            grant = await store.device_grant(record.user, record.device_id)
            if grant is not None and made_by(grant.grant_id, base_id):
                await self.grants.end(grant, REVOKED, "its code was used twice")
            raise invalid_grant("the code was used already")
        if not same_text(client_id, record.client_id):
            raise invalid_grant("the code was issued to another client")
        if redirect_uri != record.redirect_uri:
            raise invalid_grant("redirect_uri differs from the authorization request's")
        if not CODE_VERIFIER.fullmatch(verifier) or not same_text(pkce_s256(verifier), record.code_challenge):
            raise invalid_grant("the code_verifier does not match the code_challenge")
        sign_in = SignIn(
            user=record.user, device_id=record.device_id, client_id=record.client_id,
            client_name=record.client_name, scope=record.scope,
            identity_fp=record.identity_fp, password_fp=record.password_fp, second_factor=record.second_factor,
        )
        try:
            issued = await self.grants.open(sign_in, base_id, client_ip)
        except (StoreUnavailable, MatrixError, OAuthError) as exc:
            if getattr(exc, "status", 503) >= 500:  # Synapse or a store away: the client retries with this code
                with contextlib.suppress(StoreUnavailable):
                    await store.give_back_code(code_hash, uses)
            raise
        # A second use while the tokens were being made found no grant to end yet: taken once
        # more now, the code tells (a count past 2), and what this use made ends after all.
        try:
            again = await store.take_code(code_hash)
        except StoreUnavailable:  # the tokens are made: answer them rather than a 503 that spends them
            return issued
        if again is not None and again[1] > 2:
            grant = await store.device_grant(record.user, record.device_id)
            if grant is not None and made_by(grant.grant_id, base_id):
                await self.grants.end(grant, REVOKED, "its code was used again while the tokens were made")
            raise invalid_grant("the code was used already")
        return issued
