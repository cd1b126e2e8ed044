"""Sessions: one per login; a token is good only while its session is open."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from backends.base import StoreUnavailable
from backends.sessions.base import Session, SessionStore
from backends.sessions.oauth import OAuthStore
from homeserver.errors import unknown_token

if TYPE_CHECKING:
    from homeserver.metrics import Metrics

logger = logging.getLogger(__name__)

# Why sessions end, as the metrics count them.
LOGOUT, LOGOUT_ALL, DEVICE_DELETED, REVOKED, USER_REMOVED = (
    "logout", "logout_all", "device_deleted", "revoked", "user_removed",
)
# With delegation, a login naming a device ends that device's earlier sessions.
REPLACED = "replaced"
# The account behind the session was replaced, or its password changed (homeserver.credentials).
ACCOUNT_REPLACED, PASSWORD_CHANGED, CREDENTIAL_CHANGED = "account_replaced", "password_changed", "credential_changed"
# Remembered digests of recently touched sessions, per process; past this the table is
# cleared (at worst every session gets one early last-seen write).
MAX_TOUCHED = 100_000


def _unseen(session: Session) -> bool:
    """A refreshable session (one that expires) whose token was never used, as read."""
    return session.expires_ts is not None and session.last_seen_ts <= session.created_ts


def token_digest(token: str) -> str:
    """The SHA-256 of a token, hex: all a store ever keeps of it."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def now_ms() -> int:
    return int(time.time() * 1000)


class Sessions:
    """Open, check, list and end sessions in the configured session store.

    Last seen (address and time) is written at most once per `touch_interval` seconds per
    session and process, in the background: the hot path does one store read, no write.
    """

    def __init__(
        self,
        store: SessionStore,
        *,
        lifetime: int = 0,
        touch_interval: float = 60.0,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        grants: OAuthStore | None = None,
    ) -> None:
        self.store = store
        self.lifetime = lifetime
        self.touch_interval = touch_interval
        self.metrics = metrics
        self.clock = clock
        self._touched: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # Told of the first use of a session that expires and was never seen (an OAuth access
        # token: the refresh rule must know for good that it was used, homeserver.oauth.grants),
        # before the request is answered, once per process.
        self.grants = grants

    # -- login and the auth step --------------------------------------------------

    async def open(
        self,
        token: str,
        user: str,
        device_id: str,
        display_name: str | None,
        ip: str,
        *,
        identity_fp: str | None = None,
        password_fp: str | None = None,
        second_factor: str | None = None,
    ) -> None:
        """Record the session of a login's token, with the fingerprints of the credential it
        was opened with (and the second factor of the browser sign-in behind a login token);
        durable before the login is answered."""
        now = now_ms()
        digest = token_digest(token)
        session = Session(
            token_hash=digest,
            user=user,
            device_id=device_id,
            created_ts=now,
            last_seen_ip=ip,
            last_seen_ts=now,
            expires_ts=now + self.lifetime * 1000 if self.lifetime else None,
            identity_fp=identity_fp,
            password_fp=password_fp,
            second_factor=second_factor or "",
        )
        await self.store.open(session, display_name)
        self._touched[digest] = self.clock()
        if self.metrics is not None:
            self.metrics.observe_sessions_opened()

    async def record(self, session: Session, display_name: str | None, *, counted: bool = True) -> None:
        """Record a session made elsewhere (an OAuth grant's own session, whose digest is no
        token's, or an access token's with its own lifetime); durable before the sign-in is
        answered. Counted as a session opened unless `counted` is False (a further token of a
        sign-in counted already). Its first use is written as any later one (the OAuth refresh
        rule reads whether a token was used)."""
        await self.store.open(session, display_name)
        if counted and self.metrics is not None:
            self.metrics.observe_sessions_opened()

    async def check(self, token: str, user: str, ip: str | None) -> Session:
        """Return the open session of a verified token; 401 M_UNKNOWN_TOKEN when there is none.

        A session that was ended (logout, device deleted, revoked) answers `soft_logout:
        false`: the client must forget the device. A token the store never saw (issued
        before sessions, or the store was wiped) answers `soft_logout: true`: log in again
        on the same device.
        """
        session = await self.store.get(user, token_digest(token))
        if session is None:
            raise unknown_token(soft_logout=True)
        if session.ended_ts is not None:
            raise unknown_token()
        if self.grants is not None and session.token_hash not in self._touched and _unseen(session):
            await self._mark_used(self.grants, session)
        self._maybe_touch(session, session.last_seen_ip if ip is None else ip)
        return session

    @staticmethod
    async def _mark_used(grants: OAuthStore, session: Session) -> None:
        """A refreshable token's first use, written before the request is answered: the refresh
        rule reads it (homeserver.oauth.grants), and a replay of the previous refresh token sent
        the moment after this answer must find it (written in the background, it could come
        after that replay, which would pass as the retry of a lost answer). One write per
        access token and process."""
        try:
            await grants.mark_access_used(session.user, session.device_id, session.token_hash)
        except StoreUnavailable as exc:  # the session's last-seen write still tells, while it lives
            logger.debug("first use not recorded: %s", exc)

    def _maybe_touch(self, session: Session, ip: str) -> None:
        now = self.clock()
        last = self._touched.get(session.token_hash)
        if last is not None and now - last < self.touch_interval:
            return
        if len(self._touched) >= MAX_TOUCHED:
            self._touched.clear()
        self._touched[session.token_hash] = now
        task = asyncio.ensure_future(self._touch(session, ip))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _touch(self, session: Session, ip: str) -> None:
        try:
            await self.store.touch(session.user, session.token_hash, ip, now_ms())
        except StoreUnavailable as exc:  # last seen is best effort; the next request retries
            self._touched.pop(session.token_hash, None)
            logger.debug("last-seen update skipped: %s", exc)
        except Exception:
            logger.exception("last-seen update failed")

    # -- ending sessions ----------------------------------------------------------

    def _ended(self, reason: str, count: int) -> None:
        if self.metrics is not None and count:
            self.metrics.observe_sessions_ended(reason, count)

    async def end(self, session: Session, reason: str) -> None:
        """End one session (the token used, on logout); other sessions of its device stay."""
        if await self.store.end(session.user, session.token_hash):
            self._ended(reason, 1)
        self._touched.pop(session.token_hash, None)

    async def end_stale(
        self, user: str, identity_fps: list[str], password_fps: list[str] | None, reason: str
    ) -> list[str]:
        """End the user's sessions opened with other credentials; a device id per session ended."""
        devices = await self.store.end_stale(user, identity_fps, password_fps)
        self._ended(reason, len(devices))
        return devices

    async def end_devices(self, user: str, device_ids: list[str] | None, reason: str) -> int:
        """End every session of these devices (None: all the user's); the count ended."""
        count = await self.store.end_devices(user, device_ids)
        self._ended(reason, count)
        return count

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await self.store.close()
