"""What the move makes of one Synapse account, without writing anything: where the user goes, the
record a users file or Redis store gets, and the sessions and grants of their devices and tokens
(homeserver/migration/importer.py writes them, batch by batch).

- A live access token (`TokenFate.LIVE`: not expired, not an impersonation, on a device Synapse
  still has) becomes a session under the SHA-256 of the token, as ours are kept, on its device,
  expiring when it expires, opened with the fingerprints of the user's credential here (so a
  password reset or a replaced account ends it, as it ends ours). Its last-seen time is
  Synapse's (`last_validated`, else the device's `last_seen`).
- A device's newest live refresh token becomes a legacy grant (client `legacy`,
  homeserver/refresh.py): the token current, the one it superseded (if Synapse still accepts
  it) previous, the access token it came with newest (used or not, as Synapse says), with the
  grant's own session. Older chains on the same device are left (one grant per device).
- A device with neither becomes a session of its own under a digest no token can have, so
  the device (its id, name and the keys Synapse keeps for it) lives on here: ended only as
  any device is (deleted, `sessions revoke`, logout everywhere), never by a sync.

Every digest is also the move's bookkeeping (`tokens`), so a second run skips what a first
carried.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from backends.base import SYNAPSE_SCHEME, User
from backends.hashes import BCRYPT_HASH
from backends.sessions.oauth import Grant
from backends.sessions.records import Session
from backends.synapse.rows import SynapseAccount, SynapseDevice, SynapseRefreshToken, TokenFate
from homeserver.credentials import Fingerprint
from homeserver.oauth.common import GRANT_IDLE, grant_session_digest
from homeserver.refresh import LEGACY_CLIENT
from homeserver.sessions import token_digest

# Where a Synapse user goes (Placement.kind).
ADDED, KEPT, DIRECTORY = "added", "kept", "directory"  # moved: a new record, the store's record, the directory's
DEACTIVATED = "deactivated"
# What each digest of the bookkeeping stands for.
ACCESS, REFRESH, DEVICE = "access", "refresh", "device"
NOT_MOVED = ("guest", "appservice", "unapproved", "case_only", "missing", "no_hash", "bad_hash")


@dataclass
class UserPlan:
    """One account's share of a batch."""

    name: str
    kind: str  # ADDED, KEPT, DIRECTORY, DEACTIVATED, or one of NOT_MOVED
    record: User | None = None  # the store's record, the directory's, or the new one (ADDED)
    sessions: list[tuple[Session, str | None]] = field(default_factory=list)
    grants: list[tuple[Grant, float]] = field(default_factory=list)
    tokens: list[tuple[str, str]] = field(default_factory=list)  # (digest, user) of everything carried
    kinds: dict[str, str] = field(default_factory=dict)  # digest -> ACCESS, REFRESH or DEVICE
    devices: int = 0  # visible devices
    dropped_refresh: int = 0  # live chains on a device that has a newer one

    def carry(self, digest: str, kind: str) -> None:
        self.tokens.append((digest, self.name))
        self.kinds[digest] = kind

    @property
    def moved(self) -> bool:
        return self.kind in (ADDED, KEPT, DIRECTORY)


def place(account: SynapseAccount, stored: User | None, *, directory: bool) -> str:
    """Where a user goes, as the check's survey sorts them (homeserver/migration/survey.py)."""
    user = account.user
    if user.is_guest:
        return "guest"
    if user.appservice_id:
        return "appservice"
    if not user.approved:
        return "unapproved"
    if user.deactivated:
        return DEACTIVATED
    if stored is not None and stored.name != user.localpart:
        return "case_only"
    if directory:
        return DIRECTORY if stored is not None else "missing"
    if stored is not None:
        return KEPT
    if not user.password_hash:
        return "no_hash"
    return ADDED if BCRYPT_HASH.fullmatch(user.password_hash) else "bad_hash"


def new_record(account: SynapseAccount, email: str | None) -> User:
    """The users-file or Redis record of a Synapse user: Synapse's hash (its scheme named), the
    profile as Synapse shows it (its display name whole: the ident is empty), one address,
    the lock and the admin mark."""
    user, profile = account.user, account.profile
    assert user.password_hash is not None
    return User(
        name=user.localpart,
        password=user.password_hash.encode("ascii").hex(),
        ident="",
        display_name=(profile.display_name or None) if profile else None,
        avatar_url=(profile.avatar_url or None) if profile else None,
        email=email,
        locked=user.locked,
        admin=user.admin,
        password_scheme=SYNAPSE_SCHEME,
    )


def device_digest(name: str, device_id: str) -> str:
    """The session key of a device kept with no live token: no token's digest (tokens are JWTs,
    `syt_` text or macaroons, whose base64 has no colon: homeserver.synapse_tokens.maybe_legacy
    looks nothing else up)."""
    return token_digest(f"synapse-device:{name}\n{device_id}")


class Planner:
    """Builds each moved user's sessions and grants, with the credential fingerprints here."""

    def __init__(self, *, now_ms: int | None = None) -> None:
        self.now_ms = now_ms if now_ms is not None else int(time.time() * 1000)

    def sessions(self, plan: UserPlan, account: SynapseAccount, fingerprint: Fingerprint) -> None:
        """Fill `plan` with the sessions, grants and bookkeeping of a moved user's account."""
        name, now = plan.name, self.now_ms
        devices = {d.device_id: d for d in account.devices}
        covered: set[str] = set()

        def session(digest: str, device: SynapseDevice, seen: int | None, expires: int | None = None,
                    used: bool = False) -> Session:
            last = seen or device.last_seen or now
            return Session(
                token_hash=digest, user=name, device_id=device.device_id, created_ts=last - (1 if used else 0),
                last_seen_ip=device.ip or "", last_seen_ts=last, expires_ts=expires,
                identity_fp=fingerprint.identity, password_fp=fingerprint.password,
            )

        by_refresh = {t.refresh_token_id: t for t in account.access_tokens if t.refresh_token_id is not None}
        for token in account.access_tokens:
            if token.fate(now) is not TokenFate.LIVE or token.device_id not in devices:
                continue
            device = devices[token.device_id]
            digest = token_digest(token.token)
            plan.sessions.append((session(digest, device, token.last_validated, token.valid_until_ms, token.used),
                                  device.display_name))
            plan.carry(digest, ACCESS)
            covered.add(device.device_id)
        for device_id, (current, previous) in self._chains(account, plan).items():
            device = devices[device_id]
            access = by_refresh.get(current.id)
            grant = Grant(
                grant_id=f"synapse.{current.id}", user=name, device_id=device_id, client_id=LEGACY_CLIENT, scope="",
                refresh_hash=token_digest(current.token),
                previous_hash=token_digest(previous.token) if previous is not None else "",
                access_hash=token_digest(access.token) if access is not None else "",
                rotated_ts=now, created_ts=now, access_used=access is not None and access.used,
            )
            plan.grants.append((grant, self._idle(current)))
            own = session(grant_session_digest(grant.grant_id), device, None)
            plan.sessions.append((own, device.display_name))
            for refresh in (current, previous):
                if refresh is not None:
                    plan.carry(token_digest(refresh.token), REFRESH)
            covered.add(device_id)
        for device in account.devices:
            if device.device_id not in covered:
                digest = device_digest(name, device.device_id)
                plan.sessions.append((session(digest, device, None), device.display_name))
                plan.carry(digest, DEVICE)
        plan.devices = len(account.devices)

    def _chains(
        self, account: SynapseAccount, plan: UserPlan
    ) -> dict[str, tuple[SynapseRefreshToken, SynapseRefreshToken | None]]:
        """Per device, its newest live refresh token and the one it superseded, if Synapse still
        takes that one."""
        devices = {d.device_id for d in account.devices}
        live = [t for t in account.refresh_tokens if t.fate(self.now_ms) is TokenFate.LIVE and t.device_id in devices]
        superseded = {t.next_token_id: t for t in account.refresh_tokens
                      if t.fate(self.now_ms) is TokenFate.SUPERSEDED}
        chains: dict[str, tuple[SynapseRefreshToken, SynapseRefreshToken | None]] = {}
        for token in sorted(live, key=lambda t: t.id):
            if token.device_id in chains:
                plan.dropped_refresh += 1
            chains[token.device_id] = (token, superseded.get(token.id))
        return chains

    def _idle(self, token: SynapseRefreshToken) -> float:
        """Seconds the grant is kept without a refresh: ours, or less where Synapse set an end."""
        ends = [limit for limit in (token.expiry_ts, token.ultimate_session_expiry_ts) if limit is not None]
        if not ends:
            return GRANT_IDLE
        return max(1.0, min(GRANT_IDLE, (min(ends) - self.now_ms) / 1000))
