"""`SessionStore`, the main interface of a session store: sessions and devices (the records are
records.py's), the store's life, and one door to each of its other parts (each with an
interface of its own, listed in backends/sessions/__init__.py)."""

from __future__ import annotations

import abc
from typing import Any, ClassVar

from backends.sessions.browser import BrowserSessions
from backends.sessions.buckets import RateBuckets
from backends.sessions.delegation import DelegationState
from backends.sessions.factors import FactorStore
from backends.sessions.imported import ImportedState
from backends.sessions.login_tokens import LoginTokenStore
from backends.sessions.oauth import OAuthStore
from backends.sessions.records import Device, Session

__all__ = ["Device", "Session", "SessionStore"]


class SessionStore(abc.ABC):
    """Keep sessions (one per login; a token is good while its session is open) and the
    devices they belong to; and the store's life: built from `[sessions.<name>]`, started,
    checked, closed. Every method raises `backends.base.StoreUnavailable` when the store is
    down, hangs past its timeout or is locked too long.

    Used by homeserver.sessions (open, check, end) and homeserver.devices (list, rename).

    Its other parts are reached through it, one door each (`oauth()`, `browser_sessions()`,
    `buckets()`, `delegation()`, `login_tokens()`, `imported()`, `factors()`): each returns the same
    object every time, built with the store on its own connection (usable once the store is
    started), never a cast of the store.
    """

    #: the name under which the store is registered (`[sessions] store`)
    name: ClassVar[str] = ""

    @classmethod
    @abc.abstractmethod
    def from_config(cls, options: dict[str, Any], *, config_dir: str) -> SessionStore:
        """Build the store from its validated `[sessions.<name>]` section."""

    async def start(self) -> None:
        """Connect, create or migrate the schema; called in the serving process (after any fork)."""

    async def close(self) -> None:
        """Release connections and threads."""

    async def check_health(self) -> None:
        """Raise `StoreUnavailable` when the store cannot answer right now."""

    # -- its other parts: one door each --------------------------------------------------

    @abc.abstractmethod
    def oauth(self) -> OAuthStore:
        """The OAuth 2.0 API's clients, codes, grants and device authorizations (oauth.py)."""

    @abc.abstractmethod
    def browser_sessions(self) -> BrowserSessions:
        """The account page's sign-ins (browser.py)."""

    @abc.abstractmethod
    def buckets(self) -> RateBuckets:
        """The login rate-limit buckets every process on the store shares (buckets.py)."""

    @abc.abstractmethod
    def delegation(self) -> DelegationState:
        """What Synapse was told, when this server is its authentication service (delegation.py)."""

    @abc.abstractmethod
    def login_tokens(self) -> LoginTokenStore:
        """The login tokens of legacy clients' browser sign-ins (MSC3824, login_tokens.py)."""

    @abc.abstractmethod
    def imported(self) -> ImportedState:
        """A Synapse moved here: the tokens carried, the users it had deactivated (imported.py)."""

    @abc.abstractmethod
    def factors(self) -> FactorStore:
        """The second factors and their WebAuthn challenges, with `[mfa]` (factors.py)."""

    # -- sessions and devices ------------------------------------------------------------

    @abc.abstractmethod
    async def open(self, session: Session, display_name: str | None) -> None:
        """Record a new session, durably before returning (a 200 login survives kill -9).

        Creates its device when new, named `display_name` ("" for None); an existing
        device keeps its name, as in Synapse.
        """

    @abc.abstractmethod
    async def get(self, user: str, token_hash: str) -> Session | None:
        """The session of a token, ended ones included (`ended_ts` set); None if never seen
        or expired. The hot path: every authenticated request calls it."""

    @abc.abstractmethod
    async def touch(self, user: str, token_hash: str, ip: str, ts: int) -> None:
        """Record the session's last-seen address and time."""

    @abc.abstractmethod
    async def end(self, user: str, token_hash: str) -> bool:
        """End one session (logout); True if it was open."""

    @abc.abstractmethod
    async def end_devices(self, user: str, device_ids: list[str] | None) -> int:
        """End every session of these devices (None: all of the user's); how many ended."""

    @abc.abstractmethod
    async def end_stale(self, user: str, identity_fps: list[str], password_fps: list[str] | None) -> list[str]:
        """End every open session of the user whose identity fingerprint is none of
        `identity_fps`, or (when `password_fps` is given) whose password fingerprint is none of
        those (one per signing key); sessions without fingerprints stay. The device id of each
        session ended (a device ids once per session)."""

    @abc.abstractmethod
    async def refingerprint(
        self, user: str, identity_fps: list[str], password_fps: list[str] | None, new: tuple[str, str] | None
    ) -> int:
        """The user's open sessions `end_stale` would keep with these fingerprints (those
        without fingerprints aside): how many; with `new` (identity, password) they carry
        those from then on (`run.py sessions adopt`: the user store changed)."""

    @abc.abstractmethod
    async def devices(self, user: str) -> list[Device]:
        """The user's devices with at least one open session."""

    @abc.abstractmethod
    async def device(self, user: str, device_id: str) -> Device | None:
        """One device of the user, or None."""

    @abc.abstractmethod
    async def rename_device(self, user: str, device_id: str, display_name: str) -> bool:
        """Set a device's display name; False when the user has no such device."""

    @abc.abstractmethod
    async def users(self) -> list[str]:
        """The users with open sessions (to end those of users removed from the user store)."""
