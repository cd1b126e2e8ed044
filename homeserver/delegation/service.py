"""The delegation: this server as the authentication service of a Synapse (the MAS protocol).

What Synapse must be told, and when (docs/delegation.md):

- a login: the user provisioned (first login, the profile or the lock changed, or Synapse's
  profile differs from the store's: someone renamed the user there) and the device
  upserted, before the login answers; when Synapse cannot be reached the login is refused
  (503) and no session is left behind;
- a lock or an unlock: `provision_user`'s `locked` (which keeps a locked user out of Synapse's
  user directory; its tokens are refused by introspection, Synapse's MAS mode has no answer
  for "locked"), at the users file's reload, the sweep, or the next login;
- every end of a session, one way: the user's devices synced (`sync_devices`: Synapse's
  devices made those with an open session here), before the answer. As MAS turned its
  DeleteDeviceJob into SyncDevicesJob: a device deleted by name could be one a login in
  another process just opened again; a sync sends what is open, then upserts again any
  device opened meanwhile. When Synapse is away then, the session still ends here at once
  and the user is marked in the session store for a resync; a loop retries the same sync
  until Synapse has the user's devices as they are here, so neither side's restart loses a
  sign-out.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from backends.base import StoreUnavailable, User
from backends.sessions.delegation import DEACTIVATED, DEACTIVATING, DelegationState
from homeserver import audit
from homeserver.delegation.locks import KeyedLocks
from homeserver.delegation.provisioning import (
    only_the_lock_changed,
    profile_digest,
    profile_for_synapse,
    profile_matches,
)
from homeserver.delegation.settings import DelegationSettings
from homeserver.delegation.synapse import (
    SynapseBadName,
    SynapseClient,
    SynapseError,
    SynapseMisconfigured,
    SynapseNotFound,
    SynapseUnreachable,
)
from homeserver.errors import M_UNKNOWN, MatrixError
from homeserver.sessions import Sessions

if TYPE_CHECKING:
    from homeserver.metrics import Metrics

logger = logging.getLogger(__name__)

RETRY_AFTER = 5  # seconds, in the 503 of a login Synapse did not take
PROBE_LOCALPART = "homeserver-delegation-probe"


def synapse_unavailable() -> MatrixError:
    return MatrixError(
        503,
        M_UNKNOWN,
        "The homeserver (Synapse) cannot be reached right now, try again later",
        headers={"Retry-After": str(RETRY_AFTER)},
    )


class Delegation:
    """Tells Synapse about logins and ends of sessions, and keeps retrying what it missed."""

    def __init__(
        self,
        settings: DelegationSettings,
        sessions: Sessions,
        server_name: str,
        client: SynapseClient | None = None,
        metrics: Metrics | None = None,
        *,
        state: DelegationState,
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.state = state  # what Synapse was told (the session store's DelegationState)
        self.server_name = server_name
        self.metrics = metrics
        self.client = client if client is not None else SynapseClient(
            settings.synapse_url,
            settings.secret,
            settings.timeout,
            observe=metrics.observe_synapse if metrics is not None else None,
        )
        self.admins = settings.admins
        self._secret = ("Bearer " + settings.secret).encode("utf-8")
        self.locks = KeyedLocks()
        self._server_name_checked = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._refusals: dict[str, str] = {}  # the last refusal said per user, by the resync

    # -- Synapse calling us ---------------------------------------------------------

    def secret_matches(self, authorization: str | None) -> bool:
        """Whether an Authorization header carries the shared secret (constant-time)."""
        given = (authorization or "").strip().encode("utf-8", "surrogatepass")
        return hmac.compare_digest(given, self._secret)

    # -- logins ---------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def login(self, user: User, device_id: str, display_name: str | None) -> AsyncIterator[None]:
        """Around a login's session opening: Synapse first has the user (provisioned when
        new or changed) and the device; 503 with nothing done here when it cannot be told.

        If the session cannot be opened after all, the user is marked for a resync, so a
        device Synapse got for nothing is taken back.
        """
        async with self.locks.hold(user.name):
            try:
                await self._provision_unless_same(user)
                try:
                    await self.client.upsert_device(user.name, device_id, display_name)
                except SynapseNotFound:
                    # Synapse lost the user (its database was reset): provision again.
                    await self._provision(user, profile_digest(user))
                    await self.client.upsert_device(user.name, device_id, display_name)
                if not self._server_name_checked:
                    # Once per process, on the first login: Synapse's user ID shows its server_name.
                    await self.check_server_name(user.name)
            except SynapseError as exc:
                if isinstance(exc, SynapseBadName):
                    logger.error(
                        "delegation: Synapse refuses the user name %r (%s): Matrix user names are lower-case "
                        "a-z, 0-9 and ._=-/+ (with LDAP, see backend.ldap.lowercase_user_ids)",
                        user.name,
                        exc,
                    )
                else:
                    logger.warning("login of %r refused: Synapse did not take it: %s", user.name, exc)
                # The upsert may have landed before the answer was lost: take it back later.
                await self._mark(user.name)
                raise synapse_unavailable() from None
            try:
                yield
            except BaseException:
                await self._mark(user.name)
                raise

    async def _provision_unless_same(self, user: User) -> str:
        """Provision the user unless Synapse has them as the store does: "created", "updated",
        "reactivated" or "unchanged". What was last told is remembered (its digest, in the
        session store); when that is still the store's, Synapse's own profile is read
        (`query_user`, one cheap read), so a name an admin set there is put back by the next
        login. Raises SynapseError."""
        digest = profile_digest(user)
        told = await self.state.provisioned(user.name)
        if told == digest:
            try:
                found = await self.client.query_user(user.name)
            except SynapseNotFound:  # Synapse lost the user (its database was reset)
                found = None
            if found is not None:
                self._check_server_name(found)
                if profile_matches(found, user):
                    return "unchanged"
                logger.info("delegation: %r has another profile at Synapse than in the user store: put back", user.name)
            told = None
        return await self.provision(user, told, digest)

    async def provision(self, user: User, told: str | None, digest: str | None = None) -> str:
        """Tell Synapse the user as the store has them, `told` being the digest it was last
        told, and keep the new digest: "created", "updated" or "reactivated".

        A user the directory sweep deactivated (they had left the user store) is reactivated
        first: under delegation Synapse would take their tokens all the same. A change of
        the lock alone sends only the lock: the profile (and the rooms' member events) stay
        untouched at Synapse. Raises SynapseError (StoreUnavailable for the digest)."""
        digest = digest or profile_digest(user)
        if told in (DEACTIVATED, DEACTIVATING):
            await self.reactivate(user.name)
            await self._provision(user, digest)
            return "reactivated"
        if only_the_lock_changed(told, user):
            await self.client.set_locked(user.name, user.locked)
            await self.state.set_provisioned(user.name, digest)
            logger.info("delegation: %s %r at Synapse", "locked" if user.locked else "unlocked", user.name)
            return "updated"
        return "created" if await self._provision(user, digest) else "updated"

    async def provision_if_changed(self, user: User) -> None:
        """Tell Synapse the user's profile and lock when they changed since it was last told
        (a users-file reload, the session sweep); a failure is logged and left to the next time.

        Not under the user's lock: an end of sessions must not wait for it (provisioning twice
        is harmless)."""
        try:
            told = await self.state.provisioned(user.name)
            # Never told (never logged in, no directory sweep): their first login provisions.
            if told is not None and told != profile_digest(user):
                await self.provision(user, told)
        except (SynapseError, StoreUnavailable) as exc:
            logger.warning("delegation: %r not updated at Synapse yet: %s", user.name, exc)

    async def _provision(self, user: User, digest: str) -> bool:
        display, avatar, emails = profile_for_synapse(user)
        created = await self.client.provision_user(
            user.name, display_name=display, avatar_url=avatar, emails=emails, locked=user.locked
        )
        await self.state.set_provisioned(user.name, digest)
        logger.info("delegation: %s %r at Synapse%s", "created" if created else "updated", user.name,
                    " (locked)" if user.locked else "")
        return created

    async def reactivate(self, name: str) -> None:
        """Reactivate at Synapse a user the directory sweep deactivated: they are back in the
        user store (an audit line). Raises SynapseError."""
        try:
            await self.client.reactivate_user(name)
        except SynapseNotFound:
            pass  # Synapse lost them (its database was reset): the provisioning after creates them
        audit.audit(audit.REACTIVATE, user=name, reason="back in the user store")
        logger.info("delegation: reactivated %r at Synapse: back in the user store", name)

    async def deactivate(self, name: str, reason: str) -> None:
        """Deactivate the user at Synapse (`erase: false`) and remember it, so whoever
        provisions them next reactivates them first (an audit line). Raises SynapseError.

        DEACTIVATING is kept before Synapse is asked: a deactivation Synapse made whose answer
        was lost (a timeout) or never waited for (the process stopped) is still reactivated
        when they come back, and asked again while they stay away."""
        await self.state.set_provisioned(name, DEACTIVATING)
        try:
            await self.client.deactivate_user(name)
        except SynapseNotFound:
            pass  # never there, or Synapse lost them: nothing to deactivate
        await self.state.set_provisioned(name, DEACTIVATED)
        audit.audit(audit.DEACTIVATE, user=name, reason=reason)
        logger.info("delegation: deactivated %r at Synapse: %s", name, reason)

    async def check_server_name(self, localpart: str) -> None:
        """Say in one line when Synapse's server_name is not ours (user IDs would differ)."""
        try:
            found = await self.client.query_user(localpart)
        except SynapseError:
            return
        self._check_server_name(found)

    def _check_server_name(self, found: dict[str, object]) -> None:
        if self._server_name_checked:
            return
        self._server_name_checked = True
        theirs = str(found.get("user_id", "")).partition(":")[2]
        if theirs and theirs != self.server_name:
            logger.error(
                "delegation: Synapse's server_name is %r but server.server_name here is %r: user IDs differ "
                "between the two; make them equal",
                theirs,
                self.server_name,
            )

    # -- ends of sessions -------------------------------------------------------------

    async def sync_devices(self, user: str) -> bool:
        """After sessions of the user ended here (every way they end): Synapse told the
        user's devices as they are here; True when it has them, else the user is marked for
        the resync."""
        async with self.locks.hold(user):
            try:
                await self._sync(user)
                return True
            except SynapseNotFound:
                return True
            except (SynapseError, StoreUnavailable) as exc:
                logger.warning("delegation: devices of %r not synced at Synapse yet: %s", user, exc)
                await self._mark(user)
                return False

    async def _sync(self, user: str) -> list[str]:
        """`sync_devices` with the user's open devices here; the devices sent.

        A login in another process may open a session between the read and Synapse's
        answer (this process serialises its own per user): a device found open afterwards
        that was not sent is upserted again, so that login is not refused at Synapse.
        """
        devices = sorted(d.device_id for d in await self.sessions.store.devices(user))
        await self.client.sync_devices(user, devices)
        for device in await self.sessions.store.devices(user):
            if device.device_id not in devices:
                await self.client.upsert_device(user, device.device_id, device.display_name or None)
        return devices

    async def rename(self, user: str, device_id: str, display_name: str) -> None:
        """A device's new name at Synapse, before it changes here; 503 when Synapse is away."""
        try:
            await self.client.update_device_display_name(user, device_id, display_name)
        except SynapseNotFound:
            pass  # Synapse lacks the device (a resync is due): the name here is what counts
        except SynapseError as exc:
            logger.warning("delegation: rename of device %s of %r not taken by Synapse: %s", device_id, user, exc)
            raise synapse_unavailable() from None

    async def allow_cross_signing_reset(self, localpart: str) -> None:
        """Let the user replace their cross-signing keys without UIA for 10 minutes (raises SynapseError)."""
        await self.client.allow_cross_signing_reset(localpart)

    async def query_user(self, localpart: str) -> dict[str, object]:
        return await self.client.query_user(localpart)

    # -- the resync ---------------------------------------------------------------------

    async def _mark(self, user: str) -> None:
        try:
            await self.state.mark_resync(user, time.time_ns())
        except StoreUnavailable as exc:
            logger.error("delegation: cannot remember that Synapse must be told about %r again: %s", user, exc)

    async def resync_pending(self) -> tuple[int, int]:
        """Sync every marked user's devices at Synapse; (users done, users left)."""
        done = 0
        pending = await self.state.resyncs()
        for user, mark in sorted(pending.items()):
            async with self.locks.hold(user):
                try:
                    await self._sync(user)
                except SynapseNotFound:
                    pass
                except (SynapseUnreachable, SynapseMisconfigured):
                    break  # away, a wrong secret, no API (said once by the client): the others alike
                except SynapseError as exc:
                    if self._refusals.get(user) != str(exc):  # said once, not at every round
                        self._refusals[user] = str(exc)
                        logger.warning("delegation: resync of %r refused, retrying: %s", user, exc)
                    continue
                self._refusals.pop(user, None)
                await self.state.clear_resync(user, mark)
            done += 1
            logger.info("delegation: Synapse now has the devices of %r as they are here", user)
        if self.metrics is not None:
            self.metrics.observe_resyncs_pending(len(pending) - done)
        return done, len(pending) - done

    async def sync_user(self, name: str, user: User | None) -> tuple[str, list[str]]:
        """`run.py delegation sync` for one user: provisioned unless Synapse has them as the
        store does (when still in the user store), then Synapse's devices made those of the
        sessions here. What was done ("created", "updated", "unchanged", "not in the user
        store") and the devices. Raises SynapseError."""
        async with self.locks.hold(name):
            pending = (await self.state.resyncs()).get(name)
            done = "not in the user store"
            if user is not None:
                done = await self._provision_unless_same(user)
            try:
                devices = await self._sync(name)
            except SynapseNotFound:  # a user Synapse never had has no devices there
                devices = sorted(d.device_id for d in await self.sessions.store.devices(name))
            if pending is not None:
                await self.state.clear_resync(name, pending)
        return done, devices

    async def probe(self) -> bool:
        """One read-only call Synapse must answer: True when it takes our secret (a wrong
        secret, or a Synapse without delegation, is logged in one line by the client)."""
        try:
            await self.client.query_user(PROBE_LOCALPART)
        except SynapseNotFound:
            pass  # the usual answer: the secret is good, no such user
        except SynapseError:
            return False
        logger.info("delegation: Synapse at %s answers and takes our secret", self.settings.synapse_url)
        return True

    async def run_forever(self) -> None:
        """Probe Synapse until it answers (a warning, never a crash), then retry marked resyncs."""
        interval = self.settings.retry_interval
        while not await self.probe():
            await asyncio.sleep(interval)
        while True:
            try:
                await self.resync_pending()
            except StoreUnavailable as exc:
                logger.warning("delegation: resync skipped, %s", exc)
            except Exception:
                logger.exception("delegation: resync failed")
            await asyncio.sleep(interval)

    def start(self) -> None:
        task = asyncio.ensure_future(self.run_forever())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self.client.close()
