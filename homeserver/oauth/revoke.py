"""The revocation endpoint (RFC 7009): either token of a session ends the whole session (its
device; under delegation at Synapse before the answer), the newest access token even once
expired (a client logging out after a while idle); an unknown or revoked token is no error."""

from __future__ import annotations

from backends.sessions.oauth import OAuthStore
from homeserver.oauth.common import MAX_TOKEN, same_text
from homeserver.oauth.errors import INVALID_REQUEST, UNSUPPORTED_TOKEN_TYPE, OAuthError
from homeserver.oauth.grants import Grants
from homeserver.sessions import REVOKED, token_digest
from homeserver.tokens import TokenError, TokenExpired


class Revocation:
    """POST /oauth2/revoke."""

    def __init__(self, store: OAuthStore, grants: Grants) -> None:
        self.store = store
        self.grants = grants

    async def revoke(self, form: dict[str, str]) -> None:
        """End the session of the form's `token`; OAuthError for a request that names none."""
        token = form.get("token", "")
        if not token:
            raise OAuthError(INVALID_REQUEST, "token is required")
        hint = form.get("token_type_hint", "")
        if hint not in ("", "access_token", "refresh_token"):
            raise OAuthError(UNSUPPORTED_TOKEN_TYPE, "token_type_hint must be access_token or refresh_token")
        if len(token) > MAX_TOKEN:
            return
        grants = self.grants
        grant = await self.store.grant_by_refresh(token_digest(token))
        if grant is not None:
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
                await grants.end(found, REVOKED, "revoked by its access token (expired)")
            return
        except TokenError:
            return
        session = await grants.sessions.store.get(claims.name, token_digest(token))
        if session is None or session.ended_ts is not None:
            return
        await grants.devices.end(claims.name, [session.device_id], REVOKED)
        found = await self.store.device_grant(claims.name, session.device_id)
        if found is not None:
            await grants.forget(found)
