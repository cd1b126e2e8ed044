"""Devices and the end of sessions: listing, renaming, logout, deletion behind UIA, revocation, the sweep.

Every way a session ends goes through `Devices`, so whatever must follow an end (metrics,
and with delegation the device at Synapse) is done in one place.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import secrets
import string
from typing import TYPE_CHECKING, Any, Protocol

from backends.base import StoreUnavailable, User
from backends.sessions.base import Device, Session
from homeserver import audit
from homeserver.credentials import Credentials
from homeserver.errors import M_NOT_FOUND, MatrixError, invalid_param, missing_param
from homeserver.login_request import MAX_DISPLAY_NAME
from homeserver.sessions import (
    ACCOUNT_REPLACED,
    CREDENTIAL_CHANGED,
    DEVICE_DELETED,
    LOGOUT,
    LOGOUT_ALL,
    PASSWORD_CHANGED,
    REVOKED,
    USER_REMOVED,
    Sessions,
)

if TYPE_CHECKING:
    from backends.sessions.browser import BrowserSessions
    from homeserver.delegation import Delegation
    from homeserver.requester import Requester
    from homeserver.uia import UserInteractiveAuth
    from homeserver.users import Users

logger = logging.getLogger(__name__)

# The audit event of each way sessions end (homeserver.audit); the others are "sessions_ended".
AUDIT_EVENTS = {LOGOUT_ALL: audit.LOGOUT, DEVICE_DELETED: audit.LOGOUT, REVOKED: audit.REVOKE}

# More device IDs than anyone has, in one request, is a mistake or an attack.
MAX_DEVICES = 1000
# With delegation: the device id of a login that names none (as MAS makes them), and the
# longest one a client may name (Synapse refuses, 500, a token whose device id is longer).
DEVICE_ID_LENGTH = 10
MAX_SYNAPSE_DEVICE_ID = 255


def new_device_id() -> str:
    """A device id for a login that names none: 10 random letters A-Z, as MAS makes them."""
    return "".join(secrets.choice(string.ascii_uppercase) for _ in range(DEVICE_ID_LENGTH))


def device_body(device: Device) -> dict[str, Any]:
    """A device as v1.12 shows it: all four keys, never null (matrix-nio needs every one)."""
    return {
        "device_id": device.device_id,
        "display_name": device.display_name,
        "last_seen_ip": device.last_seen_ip,
        "last_seen_ts": device.last_seen_ts,
    }


def no_device() -> MatrixError:
    return MatrixError(404, M_NOT_FOUND, "Device not found")


def device_list(body: dict[str, Any]) -> list[str]:
    """The `devices` of POST /delete_devices: a list of strings."""
    devices = body.get("devices")
    if devices is None:
        raise missing_param("devices")
    if not isinstance(devices, list) or not all(isinstance(d, str) for d in devices):
        raise invalid_param("devices", "a list of strings")
    if len(devices) > MAX_DEVICES:
        raise invalid_param("devices", f"a list of at most {MAX_DEVICES} device IDs")
    return devices


def display_name_of(body: dict[str, Any]) -> str | None:
    """The `display_name` of PUT /devices/{id}: a bounded string, or None when not given."""
    name = body.get("display_name")
    if name is not None and not isinstance(name, str):
        raise invalid_param("display_name", "a string")
    if name is not None and len(name) > MAX_DISPLAY_NAME:
        raise invalid_param("display_name", f"at most {MAX_DISPLAY_NAME} characters")
    return name


class Grants(Protocol):
    """The OAuth grants in the session store (backends.sessions.oauth), as a logout asks them."""

    async def device_grant(self, user: str, device_id: str) -> object | None:
        """The grant (one device's refresh tokens) of the user's device; None when it has none."""


class Devices:
    """A user's devices, and every way their sessions end."""

    def __init__(
        self,
        sessions: Sessions,
        uia: UserInteractiveAuth | None = None,
        delegation: Delegation | None = None,
        credentials: Credentials | None = None,
        browser_sessions: BrowserSessions | None = None,
        grants: Grants | None = None,
    ) -> None:
        self.sessions = sessions
        # The account page's sign-ins end with all of a user's sessions (sign out everywhere).
        self.browser_sessions = browser_sessions
        self.uia = uia
        # With delegation, Synapse is told of every end of a session and every rename.
        self.delegation = delegation
        # Without it (the CLI), no session is ever found stale.
        self.credentials = credentials
        # With `[oauth]`: a logout of a grant's access token ends the grant's own session too.
        self.grants = grants
        self._missing: set[str] = set()  # users found missing by the last sweep

    # -- reading and renaming -----------------------------------------------------

    async def list_devices(self, user: str) -> list[Device]:
        """The user's devices with an open session, by device id."""
        return sorted(await self.sessions.store.devices(user), key=lambda d: d.device_id)

    async def get(self, user: str, device_id: str) -> Device:
        device = await self.sessions.store.device(user, device_id)
        if device is None:
            raise no_device()
        return device

    async def rename(self, user: str, device_id: str, display_name: str | None) -> None:
        """A new display name, or none given (nothing changes); 404 for a device the user lacks."""
        if display_name is None:
            await self.get(user, device_id)
            return
        if self.delegation is not None:
            await self.get(user, device_id)
            await self.delegation.rename(user, device_id, display_name)
        if not await self.sessions.store.rename_device(user, device_id, display_name):
            raise no_device()

    # -- ending sessions ----------------------------------------------------------

    async def logout(self, session: Session) -> None:
        """POST /logout: end the session of the token used (other sessions of its device stay)."""
        await self.sessions.end(session, LOGOUT)
        if self.grants is not None and await self.grants.device_grant(session.user, session.device_id) is not None:
            # An OAuth access token: its refresh token (the grant's session) ends with it.
            await self.sessions.end_devices(session.user, [session.device_id], LOGOUT)
        if self.delegation is not None:
            await self.delegation.sync_devices(session.user)
        audit.audit(audit.LOGOUT, user=session.user, device=session.device_id, reason=LOGOUT)

    async def logout_all(self, user: str) -> int:
        """POST /logout/all: end every session of the user."""
        return await self.end(user, None, LOGOUT_ALL)

    async def delete(self, requester: Requester, body: dict[str, Any], device_ids: list[str]) -> None:
        """DELETE /devices/{id}, POST /delete_devices: UIA first, then every session of those devices ends.

        Devices that do not exist (or were deleted before) are no error, as v1.12 says.
        """
        if self.uia is None:
            raise RuntimeError("device deletion needs user-interactive auth")
        operation = "delete_devices " + json.dumps(sorted(set(device_ids)))
        await self.uia.check(requester, body, operation)
        if device_ids:
            await self.end(requester.user.name, device_ids, DEVICE_DELETED)

    async def revoke(self, user: str, device_ids: list[str] | None) -> int:
        """`run.py sessions revoke`: end one device's sessions, or all of the user's."""
        return await self.end(user, device_ids, REVOKED)

    async def end_stale(self, user: User, reason: str = CREDENTIAL_CHANGED) -> int:
        """End every session of `user` opened with another credential: the account was replaced
        (a new account under the name) or its password changed; the count ended. Sessions
        opened with the current credential stay."""
        if self.credentials is None:
            return 0
        identities, passwords = self.credentials.accepted(user)
        ended = await self.sessions.end_stale(user.name, identities, passwords, reason)
        if ended:
            devices = list(dict.fromkeys(ended))
            audit.audit(audit.SESSIONS_ENDED, user=user.name, device=",".join(devices), reason=reason, count=len(ended))
            if self.delegation is not None:
                # Their devices are deleted at Synapse (unless another session of one is open).
                await self.delegation.sync_devices(user.name)
        return len(ended)

    async def end(self, user: str, device_ids: list[str] | None, reason: str) -> int:
        """End every session of these devices (None: all the user's); the count ended.

        With delegation, Synapse is told before this returns; when it is away, the sessions
        end here all the same and Synapse is told once it is back (homeserver.delegation).
        """
        if device_ids is None and self.browser_sessions is not None:
            await self.browser_sessions.end_all(user)
        count = await self.sessions.end_devices(user, device_ids, reason)
        audit.audit(
            AUDIT_EVENTS.get(reason, audit.SESSIONS_ENDED),
            user=user,
            device=None if device_ids is None else ",".join(dict.fromkeys(device_ids)),
            reason=reason,
            count=count,
        )
        if self.delegation is not None:
            await self.delegation.sync_devices(user)
        return count

    # -- upkeep -------------------------------------------------------------------

    async def sweep_removed_users(self, users: Users) -> int:
        """End the sessions of users gone from the user store in two sweeps running, and those
        opened with a credential since changed; the count ended.

        Their tokens are refused at once anyway (the auth step looks the user up); waiting
        for a second sweep only keeps a passing glitch of the store (a directory answering
        "no such entry" for a minute) from ending everybody's sessions.
        """
        ended = stale = 0
        missing = set()
        for name in await self.sessions.store.users():
            user = await users.get(name)
            if user is None:
                missing.add(name)
                if name in self._missing:
                    ended += await self.end(name, None, USER_REMOVED)
            else:
                # Sessions of a replaced account or a changed password end at their next
                # request anyway; the sweep ends (and with delegation deletes) unused ones too.
                stale += await self.end_stale(user)
                if self.delegation is not None:  # a lock or a profile changed since Synapse was told
                    await self.delegation.provision_if_changed(user)
        self._missing = missing
        if ended:
            logger.info("ended %d sessions of users removed from the user store", ended)
        if stale:
            logger.info("ended %d sessions opened with credentials changed since", stale)
        return ended + stale

    async def check_changed(self, users: Users, changes: dict[str, list[str]]) -> int:
        """The user store says these accounts changed ({name: fields}, a users-file reload):
        end at once the sessions opened with a credential they no longer have (with
        delegation, their devices at Synapse too), rather than at their next request; the
        count ended."""
        ended = 0
        for name, fields in changes.items():
            user = await users.get(name)
            if user is not None and "locked" in fields and self.delegation is not None:
                await self.delegation.provision_if_changed(user)  # Synapse is told the lock
            if "password" not in fields and "ident" not in fields:
                continue  # a lock: the sessions stay
            if user is not None:
                ended += await self.end_stale(user, PASSWORD_CHANGED if "password" in fields else ACCOUNT_REPLACED)
        return ended

    async def follow_changes(self, users: Users) -> None:
        """End at once the stale sessions of the accounts the user store says changed (a
        users-file reload; `check_changed`), rather than at their next request; until cancelled."""
        async for changes in users.changed_accounts():
            try:
                await self.check_changed(users, changes)
            except StoreUnavailable as exc:  # their next request (or the sweep) ends them instead
                logger.warning("sessions of changed accounts not ended yet: %s", exc)
            except Exception:
                logger.exception("ending the sessions of changed accounts failed")

    async def sweep_forever(self, users: Users, interval: float) -> None:
        """Sweep every `interval` seconds (jittered, so workers spread out) until cancelled."""
        while True:
            await asyncio.sleep(interval * random.uniform(0.9, 1.1))
            try:
                await self.sweep_removed_users(users)
            except StoreUnavailable as exc:
                logger.warning("session sweep skipped: %s", exc)
            except Exception:
                logger.exception("session sweep failed")
