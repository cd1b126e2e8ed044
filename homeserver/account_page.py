"""The account page's logic: its own short cookie session, the password check, and the MSC4191 actions.

No HTTP here (homeserver/handlers/account_page.py is the HTTP part). The cookie's value is
signed by Tornado (`set_signed_cookie`, with `cookie_key()` derived from the server
secret); this module decides what goes in it and whether it still stands:

- it names the user, a fingerprint of the stored credential, when it was issued and a
  nonce;
- it lasts `LIFETIME` seconds from the sign-in, no longer;
- every page request reads the user again: a user gone, locked, or whose password (or
  ident) changed since the sign-in has no page session any more;
- it stands while its sign-in (a `BrowserSession` named by the nonce) is open in the
  session store's page sessions (backends.sessions.pages): the sign-out button, "sign out
  everywhere" and POST /logout/all end it there, so a copy of the cookie is refused on
  every process and server on that store, and the page lists a user's open sign-ins.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from backends.base import User
from backends.sessions.pages import MAX_USER_AGENT, BrowserSession
from homeserver import audit
from homeserver.delegation.synapse import SynapseNotFound
from homeserver.devices import device_body, display_name_of
from homeserver.errors import MatrixError
from homeserver.login import LoginRefused, login_outcome
from homeserver.login_request import parse_login
from homeserver.names import user_id
from homeserver.profile import profile_body
from homeserver.sessions import DEVICE_DELETED, LOGOUT_ALL

if TYPE_CHECKING:
    from homeserver.context import HomeServer
    from homeserver.delegation import Delegation

logger = logging.getLogger(__name__)

COOKIE = "hs_account"
# Seconds a page sign-in lasts: long enough to sign out a lost phone, short enough that a
# forgotten browser tab is not an open door.
LIFETIME = 15 * 60
PATH = "/account/"

# MSC4191 (Matrix v1.18) account management actions, with their older unstable names.
SESSIONS_LIST = "org.matrix.sessions_list"
SESSION_VIEW = "org.matrix.session_view"
SESSION_END = "org.matrix.session_end"
CROSS_SIGNING_RESET = "org.matrix.cross_signing_reset"
PROFILE = "org.matrix.profile"
ACTIONS = (SESSIONS_LIST, SESSION_VIEW, SESSION_END, CROSS_SIGNING_RESET, PROFILE)
ALIASES = {
    "org.matrix.devices_list": SESSIONS_LIST,
    "org.matrix.device_view": SESSION_VIEW,
    "org.matrix.device_delete": SESSION_END,
}
# The audit trail's reason for the page's sign-ins and password checks, and its own event.
AUDIT_REASON = "account page"
CROSS_SIGNING_RESET_ALLOWED = "cross_signing_reset_allowed"
# Synapse opens the window for replacing the master key without UIA for this long.
RESET_WINDOW_MINUTES = 10

WRONG_CREDENTIALS = "Wrong name or password."
WRONG_PASSWORD = "Wrong password."
ACCOUNT_LOCKED = "This account is locked. Ask the server's operator."
STORE_DOWN = "The account store cannot be reached right now. Try again in a moment."
SYNAPSE_DOWN = "Synapse cannot be reached, try again."
NOT_AT_SYNAPSE = "Your account has no cross-signing keys yet: sign in with a Matrix client first."


def action_of(value: str | None) -> str:
    """The action a `?action=` names; anything unknown (or none) is the sessions list."""
    if value is None:
        return SESSIONS_LIST
    value = ALIASES.get(value, value)
    return value if value in ACTIONS else SESSIONS_LIST


def cookie_key(server_secret: str) -> str:
    """The page cookie's signing key: derived from the server secret, never the secret itself."""
    return hmac.new(server_secret.encode("utf-8"), b"homeserver account page cookie v1", hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True)
class PageSession:
    """What the page cookie carries (signed, so only this server makes one)."""

    user: str
    fingerprint: str
    issued: int  # seconds since the epoch
    nonce: str

    def encode(self) -> str:
        return json.dumps([self.user, self.fingerprint, self.issued, self.nonce], separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> PageSession | None:
        try:
            user, fingerprint, issued, nonce = json.loads(text)
        except (ValueError, TypeError):
            return None
        if not (isinstance(user, str) and isinstance(fingerprint, str) and isinstance(nonce, str)):
            return None
        if not isinstance(issued, int) or isinstance(issued, bool):
            return None
        return cls(user, fingerprint, issued, nonce)


class PageSignIns:
    """Make, check, list and end page sessions: the lifetime, the sign-in still open in the
    store, the user still there, unlocked and unchanged."""

    def __init__(
        self,
        key: str,
        hs: HomeServer,
        *,
        lifetime: int = LIFETIME,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.key = key.encode("utf-8")
        self.hs = hs
        self.store = hs.pages
        self.lifetime = lifetime
        self.clock = clock

    def fingerprint(self, user: User) -> str:
        """A keyed digest of what a password change or a replaced account changes: the stored
        hash and ident, and where the store has them the entry's own identity (`uid`) and
        what changes with a password the directory checks itself (`password_stamp`)."""
        material = json.dumps(
            [user.name, user.password, user.ident, user.uid, user.password_stamp], separators=(",", ":")
        )
        return hmac.new(self.key, material.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:32]

    def new(self, user: User) -> PageSession:
        return PageSession(user.name, self.fingerprint(user), int(self.clock()), secrets.token_urlsafe(12))

    def expires(self, session: PageSession) -> int:
        return session.issued + self.lifetime

    async def open(self, user: User, ip: str, user_agent: str) -> PageSession:
        """A new sign-in of this browser, recorded in the store before its cookie is given."""
        session = self.new(user)
        record = BrowserSession(
            session.nonce, user.name, session.issued, self.expires(session), ip, user_agent[:MAX_USER_AGENT]
        )
        await self.store.open(record)
        return session

    async def check(self, session: PageSession | None) -> tuple[User | None, str | None]:
        """(the user, None) while the session stands; else (None, why it does not, or None for no session)."""
        if session is None:
            return None, None
        now = self.clock()
        if not session.issued - 60 <= now < self.expires(session):
            return None, "expired"
        user = await self.hs.users.get(session.user)
        if user is None:
            return None, "gone"
        if user.locked:
            return None, "locked"
        if not hmac.compare_digest(self.fingerprint(user), session.fingerprint):
            return None, "changed"
        if await self.store.ended(session.user, session.nonce):
            return None, "ended"
        return user, None

    async def list_open(self, user: User) -> list[BrowserSession]:
        """The user's open sign-ins to the page, oldest first."""
        return await self.store.list_open(user.name)

    async def end(self, session: PageSession) -> None:
        """Refuse this session's cookie from now on, everywhere the session store reaches."""
        await self.store.end(session.user, session.nonce)
        audit.audit(audit.LOGOUT, user=session.user, reason=AUDIT_REASON)


class PageError(Exception):
    """Something the page tells the person (a wrong password, a limit, a store down), with a status."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def _page_error(error: MatrixError) -> PageError:
    if isinstance(error, LoginRefused) or error.status in (400, 403):
        return PageError(403, WRONG_CREDENTIALS)
    if error.errcode == "M_USER_LOCKED":
        return PageError(403, ACCOUNT_LOCKED)
    if error.status == 429:
        retry = error.headers.get("Retry-After", "1")
        return PageError(429, f"Too many attempts. Try again in {retry} seconds.", {"Retry-After": retry})
    if error.status == 503:
        return PageError(503, STORE_DOWN, {"Retry-After": error.headers.get("Retry-After", "5")})
    return PageError(500, "Something went wrong on the server. Try again later.")


async def authenticate(hs: HomeServer, name: str, password: str, client_ip: str) -> User:
    """The password check of POST /login (hs.login), opening no session: the same rules,
    stores and rate limits. A wrong name and a wrong password are one message."""
    # As Element does: text with an @ after its first character is an e-mail address.
    if "@" in name[1:] and not name.startswith("@"):
        identifier = {"type": "m.id.thirdparty", "medium": "email", "address": name}
    else:
        identifier = {"type": "m.id.user", "user": name}
    try:
        request = parse_login({"identifier": identifier, "password": password}, hs.server_name)
        user = await hs.login.authenticate(request, client_ip)
    except MatrixError as exc:
        # In the audit trail as a login is, marked as the page's (a guess here counts as one there).
        audit.audit(audit.LOGIN, user=name, client=client_ip, outcome=login_outcome(exc), reason=AUDIT_REASON)
        raise _page_error(exc) from None
    audit.audit(audit.LOGIN, user=user.name, client=client_ip, outcome=login_outcome(None), reason=AUDIT_REASON)
    return user  # hs.login.authenticate refused a locked account (M_USER_LOCKED: ACCOUNT_LOCKED)


async def confirm_password(hs: HomeServer, user: User, password: str, client_ip: str) -> None:
    """The password asked again (sign out everywhere, the reset approval), for the signed-in user."""
    try:
        again = await authenticate(hs, user.name, password, client_ip)
    except PageError as exc:
        if exc.message == WRONG_CREDENTIALS:
            raise PageError(403, WRONG_PASSWORD) from None
        raise
    if again.name != user.name:
        raise PageError(403, WRONG_PASSWORD)


# -- what the pages show and do, through the server's services -----------------------------


def profile_view(hs: HomeServer, user: User) -> dict[str, str]:
    """The profile as GET /profile shows it (display name followed by ident), and the user ID."""
    body = profile_body(user)
    return {
        "user_id": user_id(user.name, hs.server_name),
        "displayname": body["displayname"],
        "avatar_url": body.get("avatar_url", ""),
    }


async def list_devices(hs: HomeServer, user: User) -> list[dict[str, Any]]:
    return [device_body(device) for device in await hs.devices.list_devices(user.name)]


async def get_device(hs: HomeServer, user: User, device_id: str) -> dict[str, Any] | None:
    try:
        return device_body(await hs.devices.get(user.name, device_id))
    except MatrixError as exc:
        if exc.status == 404:
            return None
        raise


async def rename_device(hs: HomeServer, user: User, device_id: str, display_name: str) -> None:
    """As PUT /devices/{id}: the same bound on the name (400), 404 for a device the user lacks."""
    await hs.devices.rename(user.name, device_id, display_name_of({"display_name": display_name}))


async def end_devices(hs: HomeServer, user: User, device_ids: list[str] | None) -> int:
    """End these devices' sessions (None: all) through hs.devices, which with delegation also
    deletes the devices at Synapse before returning."""
    return await hs.devices.end(user.name, device_ids, DEVICE_DELETED if device_ids is not None else LOGOUT_ALL)


def delegation_of(hs: HomeServer) -> Delegation | None:
    """The Synapse delegation, or None when `[delegation] enabled` is false."""
    return hs.delegation


async def allow_cross_signing_reset(hs: HomeServer, user: User) -> None:
    """Ask Synapse to accept a new master cross-signing key from this user for ten minutes."""
    delegation = delegation_of(hs)
    if delegation is None:
        raise PageError(404, "This server has no Synapse behind it: there are no cross-signing keys to reset here.")
    try:
        await delegation.allow_cross_signing_reset(user.name)
        audit.audit(CROSS_SIGNING_RESET_ALLOWED, user=user.name, reason=AUDIT_REASON)
    except SynapseNotFound:
        # Never provisioned: no Matrix client ever signed in, so there are no keys to reset.
        raise PageError(404, NOT_AT_SYNAPSE) from None
    except Exception as exc:  # Synapse refused, timed out or is down: the person may retry
        logger.warning("allow_cross_signing_reset for %r failed: %r", user.name, exc)
        raise PageError(502, SYNAPSE_DOWN) from None
