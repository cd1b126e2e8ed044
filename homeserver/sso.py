"""Legacy clients through the browser (MSC3824, Matrix v1.18 "OAuth 2.0 aware clients"): the
client's redirect URL checked, and the login tokens a browser sign-in hands back to it.

A client that speaks only the legacy API opens `/login/sso/redirect?redirectUrl=URL` in a
browser (handlers/login_api.py), which leads to our page (handlers/sso_pages.py): the
browser sign-in (`PageHandler.form_sign_in`, the browser session, and its second step when
there is one), then "continue to <host>"; the browser goes back to URL with `loginToken=…`,
which the client exchanges at `POST /login {"type": "m.login.token"}` (homeserver.login).

Redirect URLs are checked as the OAuth redirect URIs are (homeserver.oauth.registration):
RFC 3986 characters only (a browser reads a backslash, a space or non-ASCII otherwise than
we do), absolute, no user or password (MAS's login_sso_redirect.rs), a host a browser reads
as we do for http and https, and never a scheme the browser itself runs or reads
(`javascript:`, `data:`, `file:` ...). Any other scheme is an application's own
(`im.fluffychat://login`, `element://connect`): the page says where the person is sent.

A login token is 256 random bits, kept as its SHA-256 digest in the session store's login
tokens part (backends.sessions.login_tokens) with the browser sign-in that made it; taken
once, within LOGIN_TOKEN_LIFETIME (Synapse's two minutes), while that browser session
stands and the account is unchanged. Never logged: the access log writes
`loginToken=redacted`.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from backends.base import User
from backends.sessions.browser import BrowserSessions
from backends.sessions.login_tokens import LoginTokenRecord, LoginTokenStore
from homeserver.account_page import BrowserSessionCookie
from homeserver.credentials import Credentials
from homeserver.errors import MatrixError, invalid_param, missing_param, user_locked
from homeserver.login import LoginRefused
from homeserver.oauth.clients import form_action_source, loopback_host
from homeserver.oauth.registration import HOST, URI_CHARS
from homeserver.sessions import token_digest
from homeserver.users import Users

logger = logging.getLogger(__name__)

# Seconds a login token may wait for its client (Synapse's LOGIN_TOKEN_EXPIRATION_TIME).
LOGIN_TOKEN_LIFETIME = 120
LOGIN_TOKEN_TYPE = "m.login.token"
SSO_TYPE = "m.login.sso"
# Our one entry in the m.login.sso flow's identity_providers (some older clients choke on an
# empty list: cinny#1931, element-android#6827); `/login/sso/redirect/{idpId}` takes any id.
IDP_ID = "homeserver"
# The page a redirect leads to: under /account/, so the browser session's cookie reaches it.
PAGE_PATH = "/account/sso"
# The query parameters the redirect and the page take.
REDIRECT_URL = "redirectUrl"
ACTION, UNSTABLE_ACTION = "action", "org.matrix.msc3824.action"
ACTIONS = ("login", "register")
TOKEN_PARAM = "loginToken"
MAX_REDIRECT_URL = 2048
SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
# Schemes a browser runs, or reads itself, instead of handing them to an application.
BROWSER_SCHEMES = frozenset({
    "javascript", "vbscript", "data", "blob", "file", "filesystem", "about", "view-source", "jar",
    "chrome", "chrome-extension", "moz-extension", "resource",
})
INVALID_TOKEN = "Invalid login token"


def refused(reason: str) -> MatrixError:
    return invalid_param(REDIRECT_URL, reason)


@dataclass(frozen=True, slots=True)
class ClientRedirect:
    """A checked redirect URL: where the person's browser goes back to the client."""

    url: str
    parts: SplitResult

    @property
    def scheme(self) -> str:
        return self.parts.scheme.lower()

    @property
    def web(self) -> bool:
        return self.scheme in ("http", "https")

    @property
    def loopback(self) -> bool:
        """An http(s) address on this very device (a desktop client's own listener)."""
        return self.web and loopback_host(self.parts.netloc) is not None

    @property
    def host(self) -> str:
        """What the page names as the destination: the host (and port) of a web address, else
        the application's own scheme (`im.fluffychat`), which names it."""
        if self.web:
            host = (self.parts.hostname or "").lower()
            host = f"[{host}]" if ":" in host else host
            return f"{host}:{self.parts.port}" if self.parts.port is not None else host
        return self.scheme

    def with_token(self, token: str) -> str:
        """The URL with `loginToken=<token>` added to its query (its own query and fragment
        kept, a `loginToken` it carried already dropped), as Synapse adds it."""
        before, hash_mark, fragment = self.url.partition("#")
        path, _, query = before.partition("?")
        pairs = [pair for pair in query.split("&") if pair and pair.split("=", 1)[0] != TOKEN_PARAM]
        pairs.append(f"{TOKEN_PARAM}={token}")
        return f"{path}?{'&'.join(pairs)}{hash_mark}{fragment}"

    def form_target(self) -> str:
        """The CSP source the page's form may be redirected to (the URL's)."""
        return form_action_source(self.url)


def check_redirect_url(value: str | None) -> ClientRedirect:
    """The redirect URL a client asked for, checked; a 400 Matrix error (M_MISSING_PARAM,
    M_INVALID_PARAM) saying what is wrong with it otherwise."""
    if not value:
        raise missing_param(REDIRECT_URL)
    if len(value) > MAX_REDIRECT_URL:
        raise refused(f"a URL of at most {MAX_REDIRECT_URL} characters")
    if not URI_CHARS.fullmatch(value):
        raise refused("a URL of RFC 3986 characters only (no spaces, backslashes or non-ASCII text)")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        raise refused("a valid URL") from None
    scheme = parts.scheme.lower()
    if not SCHEME.fullmatch(parts.scheme) or not value[len(parts.scheme):].startswith(":"):
        raise refused("an absolute URL (with its scheme)")
    if scheme in BROWSER_SCHEMES:
        raise refused(f"the address of an application, not a {scheme}: URL")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise refused("a URL without a user name or password")
    if scheme in ("http", "https") and not (value[len(scheme) + 1:].startswith("//") and HOST.fullmatch(
        parts.hostname or ""
    )):
        raise refused("an http or https URL naming its host")
    return ClientRedirect(value, parts)


def sso_action(*values: str | None) -> str | None:
    """The first known `action` (`login` or `register`) among the values given (the stable
    parameter, then MSC3824's unstable one); None for none, as MAS drops unknown ones."""
    for value in values:
        if value in ACTIONS:
            return value
    return None


class LoginTokens:
    """Login tokens made for a finished browser sign-in, and taken by `POST /login`."""

    def __init__(
        self,
        store: LoginTokenStore,
        *,
        users: Users,
        credentials: Credentials,
        browser_sessions: BrowserSessions,
        lifetime: int = LOGIN_TOKEN_LIFETIME,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.users = users
        self.credentials = credentials
        self.browser_sessions = browser_sessions
        self.lifetime = lifetime
        self.clock = clock

    async def issue(self, browser_session: BrowserSessionCookie) -> str:
        """A new login token for the person signed in by `browser_session` (with the second
        factor its sign-in passed, for the session the token opens)."""
        token = secrets.token_urlsafe(32)
        now = int(self.clock())
        record = LoginTokenRecord(
            user=browser_session.user,
            identity_fp=browser_session.identity_fp,
            password_fp=browser_session.password_fp,
            browser_session=browser_session.nonce,
            created=now,
            expires=now + self.lifetime,
            second_factor=browser_session.second_factor,
        )
        await self.store.add(token_digest(token), record)
        return token

    async def take(self, token: str) -> tuple[User, LoginTokenRecord]:
        """The user a login token stands for, and its record; the token is used up. Refused
        (403 M_FORBIDDEN, one answer for every reason, as Synapse's) when it is unknown, used,
        expired, its browser session ended, or the account changed or went since; a locked
        account is 401 M_USER_LOCKED, as a password login's."""
        record = await self.store.take(token_digest(token))
        if record is None or record.expires <= self.clock():
            raise LoginRefused(INVALID_TOKEN, "bad_token")
        user = await self.users.get(record.user)
        if user is None:
            logger.info("login token of %r refused: the account is gone", record.user)
            raise LoginRefused(INVALID_TOKEN, "bad_token")
        if self.credentials.changed(record.identity_fp, record.password_fp, user) is not None:
            logger.info("login token of %r refused: the account changed since the browser sign-in", user.name)
            raise LoginRefused(INVALID_TOKEN, "bad_token")
        if await self.browser_sessions.ended(user.name, record.browser_session):
            logger.info("login token of %r refused: its browser sign-in has ended", user.name)
            raise LoginRefused(INVALID_TOKEN, "bad_token")
        if user.locked:
            raise user_locked()
        return user, record

    async def give_back(self, token: str, record: LoginTokenRecord) -> None:
        """Keep a token taken by a login that could not finish (the store or Synapse away), so
        the client may try again within its life."""
        if record.expires > self.clock():
            await self.store.add(token_digest(token), record)
