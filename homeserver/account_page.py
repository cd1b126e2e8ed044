"""The account page's service: its browser sessions (short cookie sign-ins), the password asked again, the
cross-signing reset, and the one table from errors to what the page says.

No HTTP here (homeserver/handlers/account_pages.py is the HTTP part); built once on
`HomeServer` from the parts it needs. The cookie's value is signed by Tornado
(`set_signed_cookie`, with `cookie_key()` derived from the server secret); this module
decides what goes in it and whether it still stands:

- it names the user, the fingerprints of the credential it was opened with (the sessions'
  own, homeserver.credentials), when it was issued and a nonce;
- it lasts `LIFETIME` seconds from the sign-in, no longer;
- every page request reads the user again: a user gone, locked, or whose account or
  password changed since the sign-in (as `[sessions] end_on_password_change` says for every
  session) has no browser session any more;
- it stands while its browser session (a `BrowserSession` named by the nonce) is open in
  the session store's browser sessions (backends.sessions.browser): the sign-out button, "sign out
  everywhere" and POST /logout/all end it there, so a copy of the cookie is refused on
  every process and server on that store, and the page lists a user's open sign-ins.

The sign-in itself is the login service's (`LoginService.authenticate`: the same rules,
limits and audit line as POST /login); the devices are `Devices`'.
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
from typing import TYPE_CHECKING

from backends.base import StoreUnavailable, User
from backends.sessions.browser import MAX_USER_AGENT, BrowserSession, BrowserSessions
from homeserver import audit
from homeserver.credentials import Credentials
from homeserver.delegation.synapse import SynapseNotFound
from homeserver.errors import M_USER_LOCKED, MatrixError, PageError
from homeserver.login import LoginRefused, LoginService
from homeserver.names import user_id
from homeserver.profile import profile_body
from homeserver.users import Users

if TYPE_CHECKING:
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
NO_SYNAPSE = "This server has no Synapse behind it: there are no cross-signing keys to reset here."
SERVER_FAULT = "Something went wrong on the server. Try again later."
# Why a browser session no longer stands (`AccountPage.check`), from the credentials' words.
_CHANGED = {"password_changed": "changed", "account_replaced": "gone"}


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
class BrowserSessionCookie:
    """What a browser session's cookie carries (signed, so only this server makes one): the
    user, the credential fingerprints it was opened with (homeserver.credentials), when, a
    nonce (the `BrowserSession`'s id in the store), and the second factor its sign-in passed
    ("" for none; homeserver.mfa.second_step), which the codes and grants it makes carry on."""

    user: str
    identity_fp: str
    password_fp: str
    issued: int  # seconds since the epoch
    nonce: str
    second_factor: str = ""

    def encode(self) -> str:
        fields = [self.user, self.identity_fp, self.password_fp, self.issued, self.nonce, self.second_factor]
        return json.dumps(fields, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> BrowserSessionCookie | None:
        try:
            fields = json.loads(text)
            if isinstance(fields, list) and len(fields) == 5:
                fields.append("")  # a cookie of before second factors: none passed
            user, identity_fp, password_fp, issued, nonce, second_factor = fields
        except (ValueError, TypeError):
            return None
        if not all(isinstance(value, str) for value in (user, identity_fp, password_fp, nonce, second_factor)):
            return None
        if not isinstance(issued, int) or isinstance(issued, bool):
            return None
        return cls(user, identity_fp, password_fp, issued, nonce, second_factor)


def page_error(exc: BaseException, *, refused: str = WRONG_CREDENTIALS) -> PageError:
    """The one table from an error to what the page says: `refused` for a wrong name or
    password (the sign-in's words, or "Wrong password." where the password is asked again)."""
    if isinstance(exc, PageError):
        return exc
    if isinstance(exc, LoginRefused):
        return PageError(403, refused)
    if isinstance(exc, StoreUnavailable):
        return PageError(503, STORE_DOWN, {"Retry-After": "5"})
    if isinstance(exc, MatrixError):
        if exc.errcode == M_USER_LOCKED:
            return PageError(403, ACCOUNT_LOCKED)
        if exc.status == 429:
            retry = exc.headers.get("Retry-After", "1")
            return PageError(429, f"Too many attempts. Try again in {retry} seconds.", {"Retry-After": retry})
        if exc.status < 500 or exc.status == 503:  # a bad value, no such device, Synapse away
            return PageError(exc.status, exc.message, dict(exc.headers))
    return PageError(500, SERVER_FAULT)


class AccountPage:
    """The page's sign-ins (made, checked, listed, ended), the password asked again, the
    profile shown and the cross-signing reset."""

    def __init__(
        self,
        *,
        users: Users,
        browser_sessions: BrowserSessions,
        login: LoginService,
        credentials: Credentials,
        delegation: Delegation | None,
        server_name: str,
        lifetime: int = LIFETIME,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.users = users
        self.browser_sessions = browser_sessions
        self.login = login
        self.credentials = credentials
        # The Synapse whose cross-signing reset the page approves; None without delegation.
        self.delegation = delegation
        self.server_name = server_name
        self.lifetime = lifetime
        self.clock = clock

    # -- sign-ins ---------------------------------------------------------------------

    def new(self, user: User, second_factor: str = "") -> BrowserSessionCookie:
        fingerprint = self.credentials.of(user)
        return BrowserSessionCookie(
            user.name, fingerprint.identity, fingerprint.password, int(self.clock()), secrets.token_urlsafe(12),
            second_factor,
        )

    def expires(self, cookie: BrowserSessionCookie) -> int:
        return cookie.issued + self.lifetime

    async def open(self, user: User, ip: str, user_agent: str, second_factor: str = "") -> BrowserSessionCookie:
        """A new sign-in of this browser, recorded in the store before its cookie is given;
        `second_factor`: the one its sign-in passed ("" for none)."""
        cookie = self.new(user, second_factor)
        record = BrowserSession(
            cookie.nonce, user.name, cookie.issued, self.expires(cookie), ip, user_agent[:MAX_USER_AGENT],
            second_factor,
        )
        await self.browser_sessions.open(record)
        return cookie

    async def standing(
        self, name: str, identity_fp: str, password_fp: str, issued: int, lifetime: int
    ) -> tuple[User | None, str | None]:
        """(the user, None) while a sign-in of theirs made at `issued` with these fingerprints
        still stands (within `lifetime`, the user there, not locked, the credential the same);
        else (None, why not). A browser session's rule, and a pending sign-in's (the second step)."""
        now = self.clock()
        if not issued - 60 <= now < issued + lifetime:
            return None, "expired"
        user = await self.users.get(name)
        if user is None:
            return None, "gone"
        if user.locked:
            return None, "locked"
        why = self.credentials.changed(identity_fp, password_fp, user)
        if why is not None:
            return None, _CHANGED.get(why, "changed")
        return user, None

    async def check(self, cookie: BrowserSessionCookie | None) -> tuple[User | None, str | None]:
        """(the user, None) while its browser session stands; else (None, why it does not, or None for no cookie)."""
        if cookie is None:
            return None, None
        user, why = await self.standing(
            cookie.user, cookie.identity_fp, cookie.password_fp, cookie.issued, self.lifetime
        )
        if user is None:
            return None, why
        if await self.browser_sessions.ended(cookie.user, cookie.nonce):
            return None, "ended"
        return user, None

    async def end(self, cookie: BrowserSessionCookie) -> None:
        """End this browser session: its cookie is refused from now on, everywhere the session store reaches."""
        await self.browser_sessions.end(cookie.user, cookie.nonce)
        audit.audit(audit.LOGOUT, user=cookie.user, reason=AUDIT_REASON)

    async def confirm_password(self, user: User, password: str, client_ip: str) -> None:
        """The password asked again (ending sessions in bulk, the reset approval), for the
        signed-in user: LoginRefused when it is not theirs (`page_error(..., refused=WRONG_PASSWORD)`)."""
        again = await self.login.authenticate(user.name, password, client_ip, reason=AUDIT_REASON, typed=False)
        if again.name != user.name:
            raise LoginRefused(WRONG_PASSWORD, "bad_password")

    # -- what the pages show and do -------------------------------------------------------

    def profile_view(self, user: User) -> dict[str, str]:
        """The profile as GET /profile shows it (display name followed by ident), and the user ID."""
        body = profile_body(user)
        return {
            "user_id": user_id(user.name, self.server_name),
            "displayname": body["displayname"],
            "avatar_url": body.get("avatar_url", ""),
        }

    async def allow_cross_signing_reset(self, user: User) -> None:
        """Ask Synapse to accept a new master cross-signing key from this user for ten minutes."""
        if self.delegation is None:
            raise PageError(404, NO_SYNAPSE)
        try:
            await self.delegation.allow_cross_signing_reset(user.name)
            audit.audit(CROSS_SIGNING_RESET_ALLOWED, user=user.name, reason=AUDIT_REASON)
        except SynapseNotFound:
            # Never provisioned: no Matrix client ever signed in, so there are no keys to reset.
            raise PageError(404, NOT_AT_SYNAPSE) from None
        except Exception as exc:  # Synapse refused, timed out or is down: the person may retry
            logger.warning("allow_cross_signing_reset for %r failed: %r", user.name, exc)
            raise PageError(502, SYNAPSE_DOWN) from None
