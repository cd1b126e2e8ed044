"""Grants: one device's OAuth session (its refresh tokens, the newest access token), opened for a
sign-in a person made, refreshed by rotation, ended with the device. What the token endpoint's
grants (the code, the device code, the refresh token) and revocation share, over the services:
the sessions (homeserver.sessions), the devices (every end goes through homeserver.devices),
the user store, the credential fingerprints, and Synapse under delegation.

OAuth sessions are sessions: each access token has its session in the SessionStore (with its
`expires_ts`), and each grant a session of its own, opened with the credential fingerprints
of the sign-in, under a digest no token can have. Every way a session ends (logout, device
deletion, `sessions revoke`, a reset, the removed-user sweep) ends that one too, and a
refresh finds it ended.

Refresh (`Grants.refresh`) knows nothing of OAuth clients: a refresh token of another kind (a
password login's, one imported from Synapse) can follow the same rotation.

- Refresh rotates the refresh token. The previous one still works while the newest access
  token is unused (a client whose answer was lost retries: the spec's MUST); used after that,
  or any older one, it is a replay: `invalid_grant`, and the session ends.
- Every refresh reads the user from the user store: removed, replaced or a new password →
  `invalid_grant` and the session ends (at Synapse too, through homeserver.devices). A locked
  user's session stays, as a password session does: the refresh answers and the access token
  answers 401 M_USER_LOCKED until the account is unlocked.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from backends.base import User
from backends.sessions.base import Device, Session
from backends.sessions.oauth import ENDED, RACED, Grant, OAuthStore
from homeserver import audit
from homeserver.credentials import Credentials
from homeserver.oauth.common import GRANT_IDLE, MAX_TOKEN, grant_session_digest, new_token, now_ms, same_text
from homeserver.oauth.errors import invalid_grant
from homeserver.sessions import REPLACED, REVOKED, USER_REMOVED, Sessions, token_digest
from homeserver.tokens import TokenIssuer

if TYPE_CHECKING:
    from homeserver.delegation import Delegation
    from homeserver.devices import Devices
    from homeserver.users import Users

logger = logging.getLogger(__name__)

REFRESH_PREFIX = "mhr_"
DAY_MS = 86_400_000


@dataclass(frozen=True, slots=True)
class SignIn:
    """What a person allowed, for a grant to be opened: the user and the credential fingerprints
    of their sign-in, the client, the device and the scope."""

    user: str
    device_id: str
    client_id: str
    client_name: str  # the device's display name
    scope: str
    identity_fp: str
    password_fp: str
    second_factor: str = ""  # the one the person's browser sign-in passed ("" for none)


@dataclass(frozen=True, slots=True)
class Issued:
    """The tokens a grant was opened or refreshed with."""

    grant: Grant
    access_token: str
    refresh_token: str


class Grants:
    """Open, refresh and end grants."""

    def __init__(
        self,
        store: OAuthStore,
        *,
        sessions: Sessions,
        devices: Devices,
        users: Users,
        credentials: Credentials,
        tokens: TokenIssuer,
        delegation: Delegation | None,
    ) -> None:
        self.store = store
        self.sessions = sessions
        self.devices = devices
        self.users = users
        self.credentials = credentials
        self.tokens = tokens  # the OAuth lifetime's issuer
        self.delegation = delegation

    @property
    def lifetime(self) -> int:
        return self.tokens.lifetime

    def access_session(self, token: str, user: User, device_id: str, ip: str, second_factor: str = "") -> Session:
        now = now_ms()
        fingerprint = self.credentials.of(user)
        return Session(
            token_hash=token_digest(token), user=user.name, device_id=device_id, created_ts=now,
            last_seen_ip=ip, last_seen_ts=now, expires_ts=now + self.lifetime * 1000,
            identity_fp=fingerprint.identity, password_fp=fingerprint.password, second_factor=second_factor,
        )

    # -- a sign-in's tokens -------------------------------------------------------------

    async def open(self, sign_in: SignIn, grant_id: str, client_ip: str, via: str | None = "oauth") -> Issued:
        """The tokens of a sign-in the person made (a code, or an approved device code; a password
        login asking for a refresh token); the user is read again and must be unchanged and not
        locked. Under delegation Synapse has the user and the device before this returns. `via`
        names the sign-in in the audit line (None: the caller audits it)."""
        # One grant id per attempt: one that failed (503) leaves its ended grant session behind,
        # and the retry (the same code or approval) must not collide with it.
        grant_id = f"{grant_id}.{secrets.token_hex(4)}"
        user = await self.users.get(sign_in.user)
        if user is None:
            raise invalid_grant("the account is gone")
        if user.locked:
            raise invalid_grant("the account is locked")
        # The one fingerprint rule of every session (a secret rotated since, `[sessions]
        # end_on_password_change`), as the account page's sign-in and the auth step apply it.
        if self.credentials.changed(sign_in.identity_fp, sign_in.password_fp, user) is not None:
            raise invalid_grant("the account's password changed since the sign-in")
        fingerprint = self.credentials.of(user)  # the grant's session carries today's digests
        device_id = sign_in.device_id
        access = self.tokens.issue(user.name, device_id)
        refresh = new_token(REFRESH_PREFIX)
        now = now_ms()
        grant = Grant(
            grant_id=grant_id, user=user.name, device_id=device_id, client_id=sign_in.client_id,
            scope=sign_in.scope, refresh_hash=token_digest(refresh), previous_hash="",
            access_hash=token_digest(access), rotated_ts=now, created_ts=now, second_factor=sign_in.second_factor,
        )
        display = sign_in.client_name[:256] or None
        async with self._at_synapse(user, device_id, display):
            # Naming a device that has a session replaces it (its earlier sessions end).
            await self.sessions.end_devices(user.name, [device_id], REPLACED)
            own = Session(
                token_hash=grant_session_digest(grant_id), user=user.name, device_id=device_id, created_ts=now,
                last_seen_ip=client_ip, last_seen_ts=now,
                identity_fp=fingerprint.identity, password_fp=fingerprint.password,
                second_factor=sign_in.second_factor,
            )
            try:
                await self.sessions.record(own, display)
                first = self.access_session(access, user, device_id, client_ip, sign_in.second_factor)
                await self.sessions.record(first, display, counted=False)
                await self.store.add_grant(grant, GRANT_IDLE)
            except BaseException:
                # No answer, so no half-made session left behind (the code is spent: sign in again).
                with contextlib.suppress(Exception):
                    await self.sessions.end_devices(user.name, [device_id], REPLACED)
                raise
        await self.store.touch_client(sign_in.client_id, GRANT_IDLE)
        if via is not None:
            audit.audit(
                audit.LOGIN, user=user.name, device=device_id, client=client_ip, outcome="success",
                reason=f"{via}, client {sign_in.client_id}",
            )
        return Issued(grant, access, refresh)

    @contextlib.asynccontextmanager
    async def _at_synapse(self, user: User, device_id: str, display: str | None) -> AsyncIterator[None]:
        """With delegation, Synapse has the user and the device before the answer (503 else)."""
        if self.delegation is None:
            yield
            return
        async with self.delegation.login(user, device_id, display):
            yield

    # -- refresh: rotation ----------------------------------------------------------------

    async def refresh(self, refresh_token: str, client_ip: str, *, client_id: str | None = None) -> Issued:
        """New tokens for a refresh token (rotation); `client_id`, when given, must be the
        grant's. `invalid_grant` for an unknown, replayed or ended one."""
        digest = token_digest(refresh_token)
        grant = await self.store.grant_by_refresh(digest) if len(refresh_token) <= MAX_TOKEN else None
        if grant is None:
            raise invalid_grant("the refresh token is unknown or revoked")
        if client_id and not same_text(client_id, grant.client_id):
            raise invalid_grant("the refresh token was issued to another client")
        user = await self._still_good(grant)
        end_access = ""
        if digest == grant.previous_hash:
            if await self._access_used(grant):
                why = f"the previous refresh token was used again after the new one (from {client_ip}): a replay"
                await self.end(grant, REVOKED, why)
                raise invalid_grant("the refresh token was used already")
            # The answer to the last refresh was lost: the same tokens again, rotated once more
            # (the lost answer's access token ends with the rotation).
            logger.info(
                "oauth: %r on device %s refreshed again with the previous refresh token (an answer lost)",
                grant.user, grant.device_id,
            )
            end_access = grant.access_hash
        elif digest != grant.refresh_hash:
            await self.end(grant, REVOKED, f"an old refresh token was used again (from {client_ip}): a replay")
            raise invalid_grant("the refresh token was used already")
        access = self.tokens.issue(user.name, grant.device_id)
        refresh = new_token(REFRESH_PREFIX)
        rotated = Grant(
            grant_id=grant.grant_id, user=grant.user, device_id=grant.device_id, client_id=grant.client_id,
            scope=grant.scope, refresh_hash=token_digest(refresh),
            previous_hash=grant.previous_hash if digest == grant.previous_hash else digest,
            access_hash=token_digest(access), rotated_ts=now_ms(), created_ts=grant.created_ts,
            second_factor=grant.second_factor,
        )
        # One store write: the rotation, the new access token's session, and (a lost answer) the
        # end of the unused one, only while the grant's session is open: an end (a logout, a
        # revocation, `sessions revoke`) racing this refresh is seen, or ends the new token too.
        # The client is kept longer by the first refresh of each day (less to write on the others).
        outcome = await self.store.refresh_grant(
            grant.refresh_hash, rotated, GRANT_IDLE,
            self.access_session(access, user, grant.device_id, client_ip, grant.second_factor),
            grant_session=grant_session_digest(grant.grant_id), end_access=end_access,
            client_idle=GRANT_IDLE if rotated.rotated_ts // DAY_MS != grant.rotated_ts // DAY_MS else None,
        )
        if outcome == RACED:
            raise invalid_grant("the refresh token was used at the same time by another request")
        if outcome == ENDED:
            raise invalid_grant("the session has ended")
        return Issued(rotated, access, refresh)

    async def _still_good(self, grant: Grant) -> User:
        """The grant's user, read from the user store now; `invalid_grant` (and the session
        ended, at Synapse too) when the session ended or the user is gone or changed."""
        user = await self.users.get(grant.user)
        if user is None:
            await self.end(grant, USER_REMOVED, "the account is gone")
            raise invalid_grant("the account is gone")
        session = await self.sessions.store.get(grant.user, grant_session_digest(grant.grant_id))
        if session is None or session.ended_ts is not None:
            await self.forget(grant)
            raise invalid_grant("the session has ended")
        why = self.credentials.stale(session, user)
        if why is not None:
            await self.devices.end_stale(user, why)
            await self.forget(grant)
            raise invalid_grant("the account's password changed: sign in again")
        return user

    async def _access_used(self, grant: Grant) -> bool:
        """Whether the newest access token was used: kept on the grant at its first use (the
        sessions service marks it: Sessions.grants), for good, so a replay after the token
        expired is still one (RFC 9700 4.14.2); or, before that write has landed, what its session says. Never used, the
        retry stands, later too: the spec's MUST is that a client whose answer was lost can
        retry (a phone asleep past the token's lifetime)."""
        return grant.access_used or bool(await self.store.access_used(grant.user, grant.access_hash))

    # -- ends -------------------------------------------------------------------------------

    async def end(self, grant: Grant, reason: str, why: str) -> None:
        """End the grant's session (its device, at Synapse too) and forget the grant."""
        level = logging.INFO if reason == REVOKED and why.startswith("revoked") else logging.WARNING
        logger.log(
            level, "oauth: session of %r on device %s (client %s) ended: %s", grant.user, grant.device_id,
            grant.client_id, why,
        )
        await self.devices.end(grant.user, [grant.device_id], reason)
        await self.forget(grant)

    async def forget(self, grant: Grant) -> None:
        await self.store.delete_grant(grant)

    async def replaced(self, user: str, device_id: str) -> Device | None:
        """The user's device of that id with a session, which a grant for it would replace (its
        sessions end: naming a device that has a session takes it over), or None."""
        return await self.sessions.store.device(user, device_id)

