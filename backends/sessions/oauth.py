"""What the OAuth 2.0 API keeps (homeserver.oauth): registered clients, authorization codes and
grants (the refresh tokens of one device's session), device authorizations. A small interface
beside the SessionStore, reached by its door `SessionStore.oauth()`, implemented on the same
SQLite file or Redis (sqlite/oauth.py, redis/oauth.py, each with its oauth_device.py).

Codes and refresh tokens are kept as SHA-256 digests only, never as the tokens themselves.
The sessions of the access tokens (and the grant's own session, which every way a session
ends also ends) live in the SessionStore as any other session.
"""

from __future__ import annotations

import abc
import json
from dataclasses import asdict, dataclass
from typing import Any

from backends.sessions.records import Session

# Seconds a refresh token that was rotated away is still recognised (so its replay ends the
# session) after it stopped being the current or the previous one.
RETIRED_REFRESH_TTL = 86400.0
# What OAuthStore.refresh_grant did.
REFRESHED, RACED, ENDED = "refreshed", "raced", "ended"


@dataclass(frozen=True, slots=True)
class CodeRecord:
    """What an authorization code stands for: the person's sign-in (their user, the credential
    fingerprints it was made with) for a client, a device and a scope, and what the exchange
    must be sent again (the redirect URI, the PKCE challenge)."""

    client_id: str
    client_name: str  # as shown on the sign-in page: the device's display name
    redirect_uri: str
    code_challenge: str  # S256
    user: str
    device_id: str
    scope: str  # as granted, in the spelling the client asked
    identity_fp: str
    password_fp: str
    created_ts: int  # ms
    second_factor: str = ""  # the one the sign-in passed ("" for none)

    def encode(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | bytes) -> CodeRecord:
        return cls(**json.loads(text))


@dataclass(frozen=True, slots=True)
class Grant:
    """One device's OAuth session: its current refresh token, the one before it (valid until
    the newer tokens are used), the newest access token and whether it was used (kept here
    for good: its session expires with it)."""

    grant_id: str
    user: str
    device_id: str
    client_id: str
    scope: str  # as granted, in the spelling the client asked
    refresh_hash: str  # digest of the current refresh token
    previous_hash: str  # digest of the refresh token before it ("" for none)
    access_hash: str  # digest of the newest access token
    rotated_ts: int  # ms: when the newest tokens were issued
    created_ts: int  # ms
    access_used: bool = False  # whether the newest access token was used (OAuthStore.mark_access_used)
    second_factor: str = ""  # the one its sign-in passed ("" for none): every session it opens carries it

    def encode(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | bytes) -> Grant:
        return cls(**json.loads(text))


class OAuthStore(abc.ABC):
    """Clients, codes and grants. Every method raises `backends.base.StoreUnavailable` when the
    store cannot answer."""

    @abc.abstractmethod
    async def add_client(self, client_id: str, metadata: dict[str, Any], idle: float) -> None:
        """Keep a registered client for `idle` seconds (longer while grants of it live)."""

    @abc.abstractmethod
    async def client(self, client_id: str) -> dict[str, Any] | None:
        """A client's registered metadata, or None (never registered, or expired idle)."""

    @abc.abstractmethod
    async def touch_client(self, client_id: str, idle: float) -> None:
        """Keep the client `idle` seconds from now (it was used)."""

    @abc.abstractmethod
    async def add_code(self, code_hash: str, record: CodeRecord, ttl: float) -> None:
        """Keep an authorization code's record for `ttl` seconds."""

    @abc.abstractmethod
    async def take_code(self, code_hash: str) -> tuple[CodeRecord, int] | None:
        """The code's record and how many times it was taken, this time included (atomic:
        of two takes at once, exactly one sees 1); None when unknown or expired."""

    @abc.abstractmethod
    async def give_back_code(self, code_hash: str, uses: int) -> None:
        """Undo a take that saw `uses` (its tokens could not be made for a while): the count goes
        back by one if it is still `uses`; nothing when another take came since, or it is gone."""

    @abc.abstractmethod
    async def add_grant(self, grant: Grant, idle: float) -> None:
        """Keep a new grant `idle` seconds from its last use; it replaces any grant of the device."""

    @abc.abstractmethod
    async def grant_by_refresh(self, refresh_hash: str) -> Grant | None:
        """The grant a refresh token belongs to: its current, its previous, or one rotated away
        less than RETIRED_REFRESH_TTL ago; None otherwise."""

    @abc.abstractmethod
    async def rotate_grant(self, expected_refresh_hash: str, grant: Grant, idle: float) -> bool:
        """Replace the grant's tokens with `grant`'s if its current refresh digest is still
        `expected_refresh_hash` (compare and set); False when another rotation came first."""

    @abc.abstractmethod
    async def refresh_grant(
        self, expected_refresh_hash: str, grant: Grant, idle: float, access: Session, *,
        grant_session: str, end_access: str = "", client_idle: float | None = None,
    ) -> str:
        """One refresh, as one write where the store can: `rotate_grant`'s compare and set, the
        new access token's session `access` opened (its device is the grant's), the session of
        the digest `end_access` ended (the unused access token of a lost answer; "" for none),
        the client kept `client_idle` seconds more (None: not this time); all of it only while
        the grant's own session (the digest `grant_session`) is open, so an end (logout,
        revocation, a reset) either comes first and is seen, or comes after and ends the new
        access token with the device. REFRESHED; RACED when the current refresh digest is not
        `expected_refresh_hash` any more (nothing changed); ENDED when the grant's session has
        ended (the grant is forgotten, nothing opened)."""

    @abc.abstractmethod
    async def device_grant(self, user: str, device_id: str) -> Grant | None:
        """The grant of a user's device, or None."""

    @abc.abstractmethod
    async def delete_grant(self, grant: Grant) -> None:
        """Forget a grant (its refresh tokens stop being found)."""

    @abc.abstractmethod
    async def mark_access_used(self, user: str, device_id: str, access_hash: str) -> bool:
        """The first use of an access token: the grant of the user's device whose newest access
        token it is keeps that it was used (`Grant.access_used`, until the next rotation); True
        when this marked it, False when it was marked already or is not that grant's newest."""

    @abc.abstractmethod
    async def access_used(self, user: str, token_hash: str) -> bool | None:
        """Whether the session of an access token was used since it was opened (its last-seen
        time moved, or it ended), read afresh from the session store's own record (no
        process's cache); None when there is no such session (never opened, expired, purged)."""


    # -- the device authorization grant (RFC 8628; homeserver.oauth.device) -------------------

    @abc.abstractmethod
    async def add_device_code(self, device_hash: str, user_code_hash: str, record: dict[str, Any], ttl: float) -> bool:
        """Keep a pending device authorization (both codes as digests) for `ttl` seconds;
        False, and nothing kept, when a live authorization has this user code already."""

    @abc.abstractmethod
    async def device_code_by_user_code(self, user_code_hash: str) -> DeviceAuthorization | None:
        """The authorization a user code belongs to, whatever its state; None when unknown."""

    @abc.abstractmethod
    async def decide_device_code(
        self, device_hash: str, state: str, decision: dict[str, Any], expected: str = "pending"
    ) -> bool:
        """Record the person's answer (`state` APPROVED or DENIED, and who) on a live authorization
        in the `expected` state (atomic: of two answers at once, one wins); False when it was
        not in it. (USED back to APPROVED: the tokens could not be made, the program may poll again.)"""

    @abc.abstractmethod
    async def poll_device_code(self, device_hash: str, now_ms: int, interval_ms: int) -> DeviceAuthorization | None:
        """One poll of the token endpoint (atomic): the authorization as it was, with `too_soon`
        when the previous poll was less than `interval_ms` before `now_ms`; the poll time is
        kept, and an APPROVED authorization polled not too soon becomes USED (exactly one poll
        sees it approved). None when unknown."""


PENDING, APPROVED, DENIED, USED = "pending", "approved", "denied", "used"


@dataclass(frozen=True, slots=True)
class DeviceAuthorization:
    """A device authorization: its digest, what the client asked (`record`: client, scope,
    device, expiry), its state, and the person's decision (user, credential fingerprints)."""

    device_hash: str
    record: dict[str, Any]
    state: str
    decision: dict[str, Any]
    too_soon: bool = False
