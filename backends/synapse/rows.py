"""The rows the migration reads from Synapse's database, and what becomes of each token.

Synapse keeps its tokens in plain text (`syt_...`, `syr_...`); the `token` fields are left
out of every repr so that no token reaches a log line or a failed assertion's message.
Timestamps are Synapse's: milliseconds (`*_ms`, `*_ts` of tokens, `last_seen`), except
`creation_ts`, in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


def localpart(user_id: str) -> str:
    """`alice` of `@alice:example.org` (a localpart holds no colon; a server name may)."""
    return user_id[1:].partition(":")[0] if user_id.startswith("@") else user_id


def server_part(user_id: str) -> str:
    return user_id.partition(":")[2]


@dataclass(frozen=True, slots=True)
class SynapseUser:
    """One row of `users` (`name` is the full user ID)."""

    user_id: str
    password_hash: str | None = field(default=None, repr=False)
    admin: bool = False
    deactivated: bool = False
    locked: bool = False
    suspended: bool = False
    shadow_banned: bool = False
    is_guest: bool = False
    appservice_id: str | None = None
    user_type: str | None = None
    approved: bool = True  # NULL counts as approved, as Synapse's is_user_approved has it
    creation_ts: int | None = None

    @property
    def localpart(self) -> str:
        return localpart(self.user_id)


@dataclass(frozen=True, slots=True)
class SynapseDevice:
    """One device a person sees (`hidden` rows, cross-signing keys kept as devices, are not read)."""

    user_id: str
    device_id: str
    display_name: str | None = None
    last_seen: int | None = None
    ip: str | None = None
    user_agent: str | None = None


class TokenFate(Enum):
    """What the migration does with a token, as Synapse itself would treat it now."""

    LIVE = "live"  # Synapse accepts it now: carried
    EXPIRED = "expired"  # access token past valid_until_ms, refresh token past expiry_ts
    # An admin's token acting as another user: Synapse keeps it under the admin's user_id,
    # with no device, and names the user acted as in puppets_user_id.
    IMPERSONATION = "impersonation"
    NO_DEVICE = "no device"  # no device id, or its device is gone: Synapse under delegation refuses it
    SUPERSEDED = "superseded"  # a refresh token rotated, whose successor is not used yet: still accepted
    SPENT = "spent"  # a refresh token rotated, whose successor was used: refused


@dataclass(frozen=True, slots=True)
class SynapseAccessToken:
    """One row of `access_tokens`; `device_known`: a visible device row exists for it."""

    id: int
    user_id: str
    device_id: str | None
    token: str = field(repr=False)
    valid_until_ms: int | None = None
    puppets_user_id: str | None = None
    refresh_token_id: int | None = None
    used: bool = False
    last_validated: int | None = None
    device_known: bool = True

    def fate(self, now_ms: int) -> TokenFate:
        if self.puppets_user_id is not None:
            return TokenFate.IMPERSONATION
        if self.valid_until_ms is not None and self.valid_until_ms < now_ms:
            return TokenFate.EXPIRED
        if self.device_id is None or not self.device_known:
            return TokenFate.NO_DEVICE
        return TokenFate.LIVE


@dataclass(frozen=True, slots=True)
class SynapseRefreshToken:
    """One row of `refresh_tokens`, with its successor's state as Synapse's
    `lookup_refresh_token` reads it (a rotated token stays valid until its successor access
    token is used or the successor refresh token is itself refreshed)."""

    id: int
    user_id: str
    device_id: str
    token: str = field(repr=False)
    next_token_id: int | None = None
    expiry_ts: int | None = None
    ultimate_session_expiry_ts: int | None = None
    successor_used: bool = False
    successor_refreshed: bool = False
    device_known: bool = True

    def fate(self, now_ms: int) -> TokenFate:
        if self.next_token_id is not None and (self.successor_used or self.successor_refreshed):
            return TokenFate.SPENT
        for limit in (self.expiry_ts, self.ultimate_session_expiry_ts):
            if limit is not None and limit < now_ms:
                return TokenFate.EXPIRED
        if not self.device_known:
            return TokenFate.NO_DEVICE
        return TokenFate.SUPERSEDED if self.next_token_id is not None else TokenFate.LIVE


@dataclass(frozen=True, slots=True)
class SynapseThreepid:
    user_id: str
    medium: str  # "email" or "msisdn"
    address: str
    validated_at: int | None = None
    added_at: int | None = None


@dataclass(frozen=True, slots=True)
class SynapseProfile:
    user_id: str  # the full user ID
    display_name: str | None = None
    avatar_url: str | None = None


@dataclass(slots=True)
class SynapseAccount:
    """A user with every row that belongs to them, as `SynapseDatabase.accounts` groups them."""

    user: SynapseUser
    devices: list[SynapseDevice] = field(default_factory=list)
    access_tokens: list[SynapseAccessToken] = field(default_factory=list)
    refresh_tokens: list[SynapseRefreshToken] = field(default_factory=list)
    threepids: list[SynapseThreepid] = field(default_factory=list)
    profile: SynapseProfile | None = None

    @property
    def emails(self) -> list[str]:
        return [t.address for t in self.threepids if t.medium == "email"]
