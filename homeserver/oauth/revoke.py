"""The revocation endpoint (RFC 7009): either token of a session ends the whole session (its
device; under delegation at Synapse before the answer), the newest access token even once
expired (a client logging out after a while idle); an unknown or revoked token is no error.

A request that names a client (`client_id`) other than the token's is refused, 401
`unauthorized_client`, and nothing ends (RFC 7009 2.1; the Matrix spec's answer for "not
authorized to revoke the token"; MAS refuses it too). One that names no client revokes: the
Matrix spec asks it of a token reported leaked by someone who does not know its client (a
secret scanner). Public clients have no secret, so the check keeps a client from ending
another's session by mistake (a client holding accounts on several servers), not a thief
holding the token, who could use it anyway.
"""

from __future__ import annotations

import logging

from backends.sessions.oauth import Grant, OAuthStore
from homeserver.oauth.common import MAX_TOKEN, same_text
from homeserver.oauth.errors import INVALID_REQUEST, UNAUTHORIZED_CLIENT, UNSUPPORTED_TOKEN_TYPE, OAuthError
from homeserver.oauth.grants import Grants
from homeserver.sessions import REVOKED, token_digest
from homeserver.tokens import TokenError, TokenExpired

logger = logging.getLogger(__name__)


class Revocation:
    """POST /oauth2/revoke."""

    def __init__(self, store: OAuthStore, grants: Grants) -> None:
        self.store = store
        self.grants = grants

    async def revoke(self, form: dict[str, str]) -> None:
        """End the session of the form's `token`; OAuthError for a request that names none, or
        a client that is not the token's."""
        token = form.get("token", "")
        if not token:
            raise OAuthError(INVALID_REQUEST, "token is required")
        hint = form.get("token_type_hint", "")
        if hint not in ("", "access_token", "refresh_token"):
            raise OAuthError(UNSUPPORTED_TOKEN_TYPE, "token_type_hint must be access_token or refresh_token")
        if len(token) > MAX_TOKEN:
            return
        client_id = form.get("client_id", "")
        grants = self.grants
        grant = await self.store.grant_by_refresh(token_digest(token))
        if grant is not None:
            self._check_client(client_id, grant, grant.user, grant.device_id)
            await grants.end(grant, REVOKED, "revoked by its refresh token")
            return
        try:
            claims = grants.tokens.verify(token)
        except TokenExpired:
            # A client logs out with the access token it holds, expired or not, and both tokens
            # of its session must go (the spec's MUST): the grant whose newest token it is ends.
            expired = grants.tokens.claims_of_expired(token)
            found = await self.store.device_grant(expired.name, expired.device_id) if expired else None
            if found is not None and same_text(token_digest(token), found.access_hash):
                self._check_client(client_id, found, found.user, found.device_id)
                await grants.end(found, REVOKED, "revoked by its access token (expired)")
            return
        except TokenError:
            return
        session = await grants.sessions.store.get(claims.name, token_digest(token))
        if session is None or session.ended_ts is not None:
            return
        found = await self.store.device_grant(claims.name, session.device_id)
        self._check_client(client_id, found, claims.name, session.device_id)
        await grants.devices.end(claims.name, [session.device_id], REVOKED)
        if found is not None:
            await grants.forget(found)

    @staticmethod
    def _check_client(client_id: str, grant: Grant | None, user: str, device_id: str) -> None:
        """Refuse a request that names a client other than the one the token was issued to
        (`grant` None: a password login's token, issued to no client)."""
        if not client_id or (grant is not None and same_text(client_id, grant.client_id)):
            return
        logger.warning(
            "oauth: client %r asked to revoke a token of %s (%r, device %s): refused, another client's token",
            client_id[:64], f"client {grant.client_id}" if grant is not None else "a password login", user, device_id,
        )
        raise OAuthError(UNAUTHORIZED_CLIENT, "the token was issued to another client", 401)
