"""The token endpoint (authorization code, device code (homeserver.oauth.device) and refresh token
grants) and revocation (RFC 7009).

- A code is used once; a second use is `invalid_grant` and ends the session the first made.
- Refresh rotates the refresh token. The previous one still works while the newest access
  token is unused (a client whose answer was lost retries: the spec's MUST); used after that,
  or any older one, it is a replay: `invalid_grant`, and the session ends.
- Every refresh reads the user from the user store: removed, replaced or a new password →
  `invalid_grant` and the session ends (at Synapse too, through homeserver.devices). A locked
  user's session stays, as a password session does: the refresh answers and the access token
  answers 401 M_USER_LOCKED until the account is unlocked.
- Revocation of either token ends the whole session (the device); unknown tokens are 200.
"""

from __future__ import annotations

import contextlib
import logging
import re
import secrets
from collections.abc import AsyncIterator
from typing import Any

from backends.base import StoreUnavailable, User
from backends.sessions.oauth import ENDED, RACED, Grant
from homeserver import audit
from homeserver.errors import MatrixError
from homeserver.oauth.device import DeviceFlow
from homeserver.oauth.errors import (
    INVALID_REQUEST,
    UNSUPPORTED_GRANT_TYPE,
    UNSUPPORTED_TOKEN_TYPE,
    OAuthError,
    invalid_grant,
    invalid_request,
)
from homeserver.oauth.metadata import DEVICE_CODE_GRANT
from homeserver.oauth.service import (
    GRANT_IDLE,
    OAuth,
    grant_session_digest,
    new_token,
    now_ms,
    pkce_s256,
    same_text,
)
from homeserver.sessions import REPLACED, REVOKED, USER_REMOVED, token_digest
from homeserver.tokens import TokenError, TokenExpired

logger = logging.getLogger(__name__)

CODE_VERIFIER = re.compile(r"[A-Za-z0-9._~-]{43,128}")
REFRESH_PREFIX = "mhr_"
MAX_TOKEN = 4096
DAY_MS = 86_400_000


def _field(form: dict[str, str], name: str) -> str:
    value = form.get(name, "")
    if not value:
        raise invalid_request(f"{name} is required")
    return value


def _made_by(grant: Grant, grant_id: str) -> bool:
    """Whether a grant is what open_grant made for this grant id (one of its attempts)."""
    return grant.grant_id.partition(".")[0] == grant_id


class TokenEndpoint:
    def __init__(self, oauth: OAuth) -> None:
        self.oauth = oauth

    async def token(self, form: dict[str, str], client_ip: str) -> dict[str, Any]:
        grant_type = form.get("grant_type", "")
        if grant_type == "authorization_code":
            return await self.exchange_code(form, client_ip)
        if grant_type == "refresh_token":
            return await self.refresh(form, client_ip)
        if grant_type == DEVICE_CODE_GRANT:
            return await DeviceFlow(self.oauth).poll(form, client_ip, self.open_grant)
        if not grant_type:
            raise invalid_request("grant_type is required")
        raise OAuthError(UNSUPPORTED_GRANT_TYPE, f"grant_type {grant_type!r} is not supported")

    def _answer(self, access: str, refresh: str, scope: str) -> dict[str, Any]:
        return {
            "access_token": access,
            "token_type": "Bearer",
            "expires_in": self.oauth.lifetime,
            "refresh_token": refresh,
            "scope": scope,
        }

    # -- the authorization code grant -----------------------------------------------------

    async def exchange_code(self, form: dict[str, str], client_ip: str) -> dict[str, Any]:
        oauth = self.oauth
        code = _field(form, "code")
        client_id = _field(form, "client_id")
        redirect_uri = _field(form, "redirect_uri")
        verifier = _field(form, "code_verifier")
        code_hash = token_digest(code)
        taken = await oauth.store.take_code(code_hash) if len(code) <= MAX_TOKEN else None
        if taken is None:
            raise invalid_grant("the code is unknown or expired")
        record, uses = taken
        user_name, device_id = record["user"], record["device_id"]
        grant_id = "c" + code_hash[:31]  # what this code makes, found again by a second use
        if uses > 1:
            grant = await oauth.store.device_grant(user_name, device_id)
            if grant is not None and _made_by(grant, grant_id):
                logger.warning("oauth: a code of %r used twice: ending the session it made", user_name)
                await oauth.devices.end(user_name, [device_id], REVOKED)
                await oauth.forget(grant)
            raise invalid_grant("the code was used already")
        if not same_text(client_id, record["client_id"]):
            raise invalid_grant("the code was issued to another client")
        if redirect_uri != record["redirect_uri"]:
            raise invalid_grant("redirect_uri differs from the authorization request's")
        if not CODE_VERIFIER.fullmatch(verifier) or not same_text(pkce_s256(verifier), record["code_challenge"]):
            raise invalid_grant("the code_verifier does not match the code_challenge")
        try:
            answer = await self.open_grant(record, grant_id, client_ip)
        except (StoreUnavailable, MatrixError, OAuthError) as exc:
            if getattr(exc, "status", 503) >= 500:  # Synapse or a store away: the client retries with this code
                with contextlib.suppress(StoreUnavailable):
                    await oauth.store.give_back_code(code_hash, uses)
            raise
        # A second use while the tokens were being made found no grant to end yet: taken once
        # more now, the code tells (a count past 2), and what this use made ends after all.
        try:
            again = await oauth.store.take_code(code_hash)
        except StoreUnavailable:  # the tokens are made: answer them rather than a 503 that spends them
            return answer
        if again is not None and again[1] > 2:
            grant = await oauth.store.device_grant(user_name, device_id)
            if grant is not None and _made_by(grant, grant_id):
                await self._end(grant, REVOKED, "its code was used again while the tokens were made")
            raise invalid_grant("the code was used already")
        return answer

    async def open_grant(
        self, record: dict[str, Any], grant_id: str, client_ip: str, via: str = "oauth"
    ) -> dict[str, Any]:
        """The tokens of a sign-in the person made (a code, or an approved device code): `record`
        names the user, the device, the client, the scope and the credential fingerprints of
        the sign-in; the user is read again and must be unchanged and not locked. Under
        delegation Synapse has the user and the device before the answer."""
        oauth = self.oauth
        user_name, device_id, client_id = record["user"], record["device_id"], record["client_id"]
        # One grant id per attempt: one that failed (503) leaves its ended grant session behind,
        # and the retry (the same code or approval) must not collide with it.
        grant_id = f"{grant_id}.{secrets.token_hex(4)}"
        user = await oauth.users.get(user_name)
        if user is None:
            raise invalid_grant("the account is gone")
        if user.locked:
            raise invalid_grant("the account is locked")
        # The one fingerprint rule of every session (a secret rotated since, `[sessions]
        # end_on_password_change`), as the account page's sign-in and the auth step apply it.
        if oauth.credentials.changed(record["identity_fp"], record["password_fp"], user) is not None:
            raise invalid_grant("the account's password changed since the sign-in")
        fingerprint = oauth.credentials.of(user)  # the grant's session carries today's digests
        access = oauth.tokens.issue(user.name, device_id)
        refresh = new_token(REFRESH_PREFIX)
        now = now_ms()
        grant = Grant(
            grant_id=grant_id, user=user.name, device_id=device_id, client_id=client_id, scope=record["scope"],
            refresh_hash=token_digest(refresh), previous_hash="", access_hash=token_digest(access),
            rotated_ts=now, created_ts=now,
        )
        display = str(record.get("client_name") or "")[:256] or None
        async with self._at_synapse(user, device_id, display):
            # Naming a device that has a session replaces it (its earlier sessions end).
            await oauth.devices.sessions.end_devices(user.name, [device_id], REPLACED)
            fps = (fingerprint.identity, fingerprint.password)
            try:
                await oauth.sessions.open(oauth.grant_session(grant_id, user, device_id, client_ip, fps), display)
                await oauth.sessions.open(oauth.access_session(access, user, device_id, client_ip), display)
                await oauth.store.add_grant(grant, GRANT_IDLE)
            except BaseException:
                # No answer, so no half-made session left behind (the code is spent: sign in again).
                with contextlib.suppress(Exception):
                    await oauth.devices.sessions.end_devices(user.name, [device_id], REPLACED)
                raise
        await oauth.store.touch_client(client_id, GRANT_IDLE)
        audit.audit(
            audit.LOGIN, user=user.name, device=device_id, client=client_ip, outcome="success",
            reason=f"{via}, client {client_id}",
        )
        if oauth.devices.sessions.metrics is not None:
            oauth.devices.sessions.metrics.observe_sessions_opened()
        return self._answer(access, refresh, record["scope"])

    @contextlib.asynccontextmanager
    async def _at_synapse(self, user: User, device_id: str, display: str | None) -> AsyncIterator[None]:
        """With delegation, Synapse has the user and the device before the answer (503 else)."""
        delegation = self.oauth.delegation
        if delegation is None:
            yield
            return
        async with delegation.login(user, device_id, display):
            yield

    # -- the refresh token grant ----------------------------------------------------------

    async def refresh(self, form: dict[str, str], client_ip: str) -> dict[str, Any]:
        oauth = self.oauth
        token = _field(form, "refresh_token")
        digest = token_digest(token)
        grant = await oauth.store.grant_by_refresh(digest) if len(token) <= MAX_TOKEN else None
        if grant is None:
            raise invalid_grant("the refresh token is unknown or revoked")
        client_id = form.get("client_id")
        if client_id and not same_text(client_id, grant.client_id):
            raise invalid_grant("the refresh token was issued to another client")
        user = await self._still_good(grant)
        end_access = ""
        if digest == grant.previous_hash:
            if await self._access_used(grant):
                await self._end(grant, REVOKED, "the previous refresh token was used again after the new one")
                raise invalid_grant("the refresh token was used already")
            # The answer to the last refresh was lost: the same tokens again, rotated once more
            # (the lost answer's access token ends with the rotation).
            end_access = grant.access_hash
        elif digest != grant.refresh_hash:
            await self._end(grant, REVOKED, "an old refresh token was used again")
            raise invalid_grant("the refresh token was used already")
        access = oauth.tokens.issue(user.name, grant.device_id)
        refresh = new_token(REFRESH_PREFIX)
        rotated = Grant(
            grant_id=grant.grant_id, user=grant.user, device_id=grant.device_id, client_id=grant.client_id,
            scope=grant.scope, refresh_hash=token_digest(refresh),
            previous_hash=grant.previous_hash if digest == grant.previous_hash else digest,
            access_hash=token_digest(access), rotated_ts=now_ms(), created_ts=grant.created_ts,
        )
        # One store write: the rotation, the new access token's session, and (a lost answer) the
        # end of the unused one, only while the grant's session is open: an end (a logout, a
        # revocation, `sessions revoke`) racing this refresh is seen, or ends the new token too.
        # The client is kept longer by the first refresh of each day (less to write on the others).
        outcome = await oauth.store.refresh_grant(
            grant.refresh_hash, rotated, GRANT_IDLE, oauth.access_session(access, user, grant.device_id, client_ip),
            grant_session=grant_session_digest(grant.grant_id), end_access=end_access,
            client_idle=GRANT_IDLE if rotated.rotated_ts // DAY_MS != grant.rotated_ts // DAY_MS else None,
        )
        if outcome == RACED:
            raise invalid_grant("the refresh token was used at the same time by another request")
        if outcome == ENDED:
            raise invalid_grant("the session has ended")
        return self._answer(access, refresh, grant.scope)

    async def _still_good(self, grant: Grant) -> User:
        """The grant's user, read from the user store now; `invalid_grant` (and the session
        ended, at Synapse too) when the session ended or the user is gone or changed."""
        oauth = self.oauth
        user = await oauth.users.get(grant.user)
        if user is None:
            await self._end(grant, USER_REMOVED, "the account is gone")
            raise invalid_grant("the account is gone")
        session = await oauth.sessions.get(grant.user, grant_session_digest(grant.grant_id))
        if session is None or session.ended_ts is not None:
            await oauth.forget(grant)
            raise invalid_grant("the session has ended")
        why = oauth.credentials.stale(session, user)
        if why is not None:
            await oauth.devices.end_stale(user, why)
            await oauth.forget(grant)
            raise invalid_grant("the account's password changed: sign in again")
        return user

    async def _access_used(self, grant: Grant) -> bool:
        """Whether the newest access token is known to have been used. Once its session has
        expired the store cannot tell, and the retry stands: the spec's MUST is that a client
        whose answer was lost can retry later (a phone asleep past the token's lifetime), and a
        thief's replay is still seen at the client's next refresh, whose token it retired."""
        return bool(await self.oauth.store.access_used(grant.user, grant.access_hash))

    async def _end(self, grant: Grant, reason: str, why: str) -> None:
        level = logging.INFO if reason == REVOKED and why.startswith("revoked") else logging.WARNING
        logger.log(level, "oauth: session of %r on device %s ended: %s", grant.user, grant.device_id, why)
        await self.oauth.devices.end(grant.user, [grant.device_id], reason)
        await self.oauth.forget(grant)

    # -- revocation -------------------------------------------------------------------------

    async def revoke(self, form: dict[str, str]) -> None:
        """RFC 7009: the session of either token ends (with delegation, its device at Synapse
        before this returns); an unknown or revoked token is no error."""
        token = form.get("token", "")
        if not token:
            raise OAuthError(INVALID_REQUEST, "token is required")
        hint = form.get("token_type_hint", "")
        if hint not in ("", "access_token", "refresh_token"):
            raise OAuthError(UNSUPPORTED_TOKEN_TYPE, "token_type_hint must be access_token or refresh_token")
        if len(token) > MAX_TOKEN:
            return
        oauth = self.oauth
        grant = await oauth.store.grant_by_refresh(token_digest(token))
        if grant is not None:
            await self._end(grant, REVOKED, "revoked by its refresh token")
            return
        try:
            claims = oauth.tokens.verify(token)
        except TokenExpired:
            # A client logs out with the access token it holds, expired or not, and both tokens
            # of its session must go (the spec's MUST): the grant whose newest token it is ends.
            expired = oauth.tokens.claims_of_expired(token)
            found = await oauth.store.device_grant(expired.name, expired.device_id) if expired else None
            if found is not None and same_text(token_digest(token), found.access_hash):
                await self._end(found, REVOKED, "revoked by its access token (expired)")
            return
        except TokenError:
            return
        session = await oauth.sessions.get(claims.name, token_digest(token))
        if session is None or session.ended_ts is not None:
            return
        await oauth.devices.end(claims.name, [session.device_id], REVOKED)
        found = await oauth.store.device_grant(claims.name, session.device_id)
        if found is not None:
            await oauth.forget(found)

