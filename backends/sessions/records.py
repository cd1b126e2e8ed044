"""Sessions and devices as the session store keeps them: the records every part and the
services above pass around (the store's interface is base.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Session:
    """One login's session. The token itself is never stored: only its SHA-256 digest."""

    token_hash: str  # hex SHA-256 of the token text
    user: str  # the stored user name (the token's `sub`)
    device_id: str
    created_ts: int  # ms since the epoch
    last_seen_ip: str
    last_seen_ts: int  # ms
    expires_ts: int | None = None  # ms; None when tokens have no lifetime
    # Set when the session was ended (logout, device deleted, revoked). An ended session
    # is kept a while as a tombstone so its token is told `soft_logout: false`, while a
    # token the store never saw is told `soft_logout: true`.
    ended_ts: int | None = None
    # Keyed digests of what the session was opened with (homeserver.credentials): the
    # account's identity and its password. None for sessions opened before they were kept.
    identity_fp: str | None = None
    password_fp: str | None = None
    # The second factor the sign-in that opened it passed ("totp", "webauthn", "recovery"),
    # carried from the browser session through the code or the device approval and the grant;
    # "" for none (a password login, a bot's `sessions issue`, a session opened before).
    second_factor: str = ""


@dataclass(frozen=True, slots=True)
class Device:
    """What GET /devices shows. A device exists while at least one session of it is open."""

    device_id: str
    display_name: str  # "" when never named
    last_seen_ip: str  # of the device's most recently seen session
    last_seen_ts: int  # ms, the latest over its sessions
    second_factor: str = ""  # of the device's most recently seen session (Session.second_factor)
