"""The account page's base handler: HTML for people, not the JSON API.

Pages share the API's request plumbing (handlers.base.ServerHandler: in-flight tracking, the
client's address, the request ID) but not BaseHandler: no CORS, no JSON errors, but a strict
Content-Security-Policy, HTML error pages, Tornado's XSRF check on every form and the page's
own browser session, its signed cookie (homeserver.account_page holds the logic). Also the
page's stylesheet.
"""

from __future__ import annotations

import hmac
import logging
import os
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from tornado.web import HTTPError, RequestHandler

from backends.base import User
from homeserver import account_page as page
from homeserver import audit
from homeserver.account_page import AccountPage, BrowserSessionCookie, page_error
from homeserver.errors import HTTPProblem, MatrixError, PageError
from homeserver.handlers.base import ServerHandler
from homeserver.mfa import second_step
from homeserver.mfa.second_step import PendingSignIn

logger = logging.getLogger(__name__)

TEMPLATES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "templates")
STYLESHEET = os.path.join(TEMPLATES, "account", "style.css")
WEBAUTHN_JS = os.path.join(os.path.dirname(TEMPLATES), "static", "webauthn.js")

# The pages' Content-Security-Policy, directive by directive: nothing but the page's own
# stylesheet and images, forms only to the page itself, never in a frame. A page that needs
# more (a form the OAuth sign-in redirects to the client) adds sources (PageHandler.allow).
CSP = (
    ("default-src", "'none'"),
    ("style-src", "'self'"),
    ("img-src", "'self'"),
    ("form-action", "'self'"),
    ("frame-ancestors", "'none'"),
    ("base-uri", "'none'"),
)


def content_security_policy(extra: dict[str, list[str]] | None = None) -> str:
    """The CSP header's value: CSP with `extra` sources added to their directives (or new ones)."""
    directives = {name: [source] for name, source in CSP}
    for name, sources in (extra or {}).items():
        directives.setdefault(name, []).extend(sources)
    return "; ".join(f"{name} {' '.join(sources)}" for name, sources in directives.items())


SECURITY_HEADERS = (
    ("Content-Security-Policy", content_security_policy()),
    ("X-Frame-Options", "DENY"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
)
HTML_TYPE = "text/html; charset=UTF-8"

# What a form's outcome tells the page the redirect shows: fixed texts chosen by key, carried
# in a short-lived signed cookie read once (never in the URL, where a link could claim what
# did not happen).
FLASH = "hs_flash"
FLASH_LIFETIME = 60  # seconds: the redirect is followed at once
NOTICES = {
    "signed_out": "You are signed out of this page.",
    "signed_out_everywhere": "Every session of your account has ended, and this page is signed out.",
    "renamed": "The session is renamed.",
    "ended": "The session is signed out.",
    "ended_others": "Every other session is signed out.",
    "factor_removed": "The second factor is removed.",
    "reset_allowed": (
        f"Approved. For the next {page.RESET_WINDOW_MINUTES} minutes your Matrix client may reset your "
        "cross-signing keys: go back to it and finish the reset there."
    ),
}
WHY_SIGNED_OUT = {
    "expired": "Your sign-in on this page has ended. Sign in again.",
    "gone": "Your sign-in on this page has ended. Sign in again.",
    "ended": "You are signed out of this page.",
    "locked": page.ACCOUNT_LOCKED,
    "changed": "Your password changed, so this page signed you out. Sign in again.",
    "second_factor": "Your account now signs in with a second factor. Sign in again.",
}


# What the sessions list says of the second factor a sign-in passed (with `[mfa]` on).
SECOND_FACTOR_NAMES = {
    "totp": "Authenticator app", "webauthn": "Passkey", "recovery": "Recovery code", "": "None (password only)",
}


def when(ms: int) -> str:
    """A time for people: UTC, to the minute."""
    if not ms:
        return "never"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC")


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


def page_url(action: str | None = None, **params: str | None) -> str:
    """/account/ with an action and parameters (None values left out)."""
    query = {"action": action, **params}
    pairs = [(key, value) for key, value in query.items() if value is not None]
    return page.PATH + ("?" + urlencode(pairs) if pairs else "")


class PageHandler(ServerHandler):
    """HTML pages: security headers, HTML errors, XSRF on every POST, the browser session loaded.

    "Signed in" is `self.user` (with `self.browser_session`): a browser session that stands,
    through its second step when the person needs one. A sign-in waiting for its second step
    is `self.pending` (with `self.pending_user`), which only the second step's page reads:
    every other page sees a person signed out."""

    expected_errors = (HTTPError, PageError)
    user: User | None = None
    browser_session: BrowserSessionCookie | None = None
    signed_out_why: str | None = None
    pending: PendingSignIn | None = None
    pending_user: User | None = None
    _csp_extra: dict[str, list[str]] | None = None

    @property
    def account_page(self) -> AccountPage:
        return self.hs.account_page

    @property
    def secure(self) -> bool:
        return self.hs.base_url.startswith("https://")

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", HTML_TYPE)
        for name, value in SECURITY_HEADERS:
            self.set_header(name, value)
        self.set_request_headers()

    def get_template_path(self) -> str:
        return TEMPLATES

    @property
    def content_security_policy(self) -> str:
        """This answer's CSP: the pages' own, with the sources `allow` added."""
        return content_security_policy(self._csp_extra)

    def allow(self, directive: str, source: str) -> None:
        """Let this answer's CSP `directive` take `source` too (a form redirected to a client)."""
        if self._csp_extra is None:
            self._csp_extra = {}
        self._csp_extra.setdefault(directive, []).append(source)
        self.set_header("Content-Security-Policy", self.content_security_policy)

    def set_cookie(self, name: str, value: str | bytes, *args: Any, **kwargs: Any) -> None:
        """Every cookie of the page (the session's and the XSRF one): HttpOnly, SameSite=Strict,
        Secure on https, for /account/ only, gone when the browser closes unless given a lifetime."""
        kwargs.pop("expires_days", None)
        kwargs.update(httponly=True, samesite="Strict", secure=self.secure, path=page.PATH)
        super().set_cookie(name, value, *args, **kwargs)

    def clear_cookie(self, name: str, **kwargs: Any) -> None:
        super().clear_cookie(name, path=page.PATH, httponly=True, samesite="Strict", secure=self.secure)

    def flash(self, notice: str) -> None:
        """Tell the next page of this browser what a form did (one of NOTICES' keys)."""
        self.set_signed_cookie(FLASH, notice, max_age=FLASH_LIFETIME)

    def take_flash(self) -> str | None:
        """The text of the outcome a form left for this page, once: the cookie is cleared."""
        if self.get_cookie(FLASH) is None:
            return None
        self.clear_cookie(FLASH)
        raw = self.get_signed_cookie(FLASH, max_age_days=FLASH_LIFETIME / 86400)
        return NOTICES.get(raw.decode("utf-8", "replace")) if raw is not None else None

    async def prepare(self) -> None:
        audit.client_address.set(self.client_ip)  # every audit line of the request names it
        if self.request.method == "POST":
            self.check_xsrf_cookie()
        raw = self.get_signed_cookie(page.COOKIE, max_age_days=page.LIFETIME / 86400)
        cookie = BrowserSessionCookie.decode(raw.decode("utf-8", "replace")) if raw is not None else None
        self.user, self.signed_out_why = await self.account_page.check(cookie)
        if self.user is not None and cookie is not None and not await self._second_step_done(self.user, cookie):
            self.user, self.signed_out_why = None, "second_factor"
        if self.user is not None:
            self.browser_session = cookie
        elif self.get_cookie(page.COOKIE):
            # Past its lifetime, tampered with, or no longer standing: gone from the browser too.
            self.signed_out_why = self.signed_out_why or "expired"
            self.clear_cookie(page.COOKIE)
        step = self.hs.second_step
        if self.user is None and step is not None and self.get_cookie(second_step.COOKIE):
            raw = self.get_signed_cookie(second_step.COOKIE, max_age_days=step.lifetime / 86400)
            self.pending = PendingSignIn.decode(raw.decode("utf-8", "replace")) if raw is not None else None
            self.pending_user = await step.standing(self.pending)
            if self.pending_user is None:
                self.pending = None
                self.clear_cookie(second_step.COOKIE)

    async def _second_step_done(self, user: User, cookie: BrowserSessionCookie) -> bool:
        """Whether a standing browser session counts: it passed a second factor, or its person
        needs none (one made before `[mfa]`, or before the person had to have one, does not)."""
        if cookie.second_factor or self.hs.mfa_policy is None:
            return True
        return not await self.hs.mfa_policy.needed(user)

    def back_from_second_step(self) -> bool:
        """Whether this request is the one the second step just sent the person back to (its
        path and query, within a minute, once): a page then goes on as after its own sign-in."""
        if self.get_cookie(second_step.BACK_COOKIE) is None:
            return False
        self.clear_cookie(second_step.BACK_COOKIE)
        raw = self.get_signed_cookie(second_step.BACK_COOKIE, max_age_days=second_step.BACK_LIFETIME / 86400)
        return raw is not None and hmac.compare_digest(raw, second_step.digest(self.request.uri or "").encode())

    async def form_sign_in(self, name: str, password: str, reason: str, then: str) -> User | None:
        """A sign-in form's name and password checked by the login service (its rules, limits,
        lock and audit line, marked `reason`), then signed in on the account page (its cookie):
        every page's sign-in. PageError when refused (a page shows it with `render_page(problem=...)`).

        None when the person must pass a second step first: the answer is sent (a redirect to
        the second step's page, which sends them back to `then`, the path of the page they
        signed in on, once through)."""
        try:
            user = await self.hs.login.authenticate(name, password, self.client_ip, reason=reason)
        except MatrixError as exc:
            raise page_error(exc) from None
        step = self.hs.second_step
        if step is not None and await step.needed(user):
            pending = await step.begin(user, then, reason)
            self.set_signed_cookie(second_step.COOKIE, pending.encode(), max_age=step.lifetime)
            if self.get_cookie(page.COOKIE):
                self.clear_cookie(page.COOKIE)  # whoever was signed in here is not any more
            self.user = self.browser_session = None
            logger.info("%s: %s gave their password; the second step is next", reason, user.name)
            self.redirect(second_step.url(then), status=303)
            return None
        user_agent = self.request.headers.get("User-Agent", "")
        self.browser_session = await self.account_page.open(user, self.client_ip, user_agent)
        self.set_signed_cookie(page.COOKIE, self.browser_session.encode(), max_age=page.LIFETIME)
        self.user = user
        logger.info("%s: %s signed in", reason, user.name)
        return user

    # -- rendering ------------------------------------------------------------------

    def render_page(
        self, template: str, status: int = 200, *, problem: HTTPProblem | None = None, **values: Any
    ) -> None:
        """Render a page of templates/account/; with `problem`, an error shown on it: its
        status and headers on the answer, its message as the page's error."""
        if problem is not None:
            self.apply_problem(problem)
            values["error"] = problem.message
        else:
            self.set_status(status)
        user, browser_session = self.user, self.browser_session
        namespace: dict[str, Any] = {
            "user": user,
            "user_id": f"@{user.name}:{self.hs.server_name}" if user is not None else "",
            "server_name": self.hs.server_name,
            "browser_session": browser_session,
            "expires": when(self.account_page.expires(browser_session) * 1000) if browser_session is not None else "",
            "notice": None,
            "error": None,
            "page_url": page_url,
            "when": when,
            "iso": iso,
            "actions": page,
            "title": "Your account",
            "current": None,
            "name": "",
            "script": None,  # a page with a passkey button: webauthn.js (and `allow("script-src", "'self'")`)
            "mfa": self.hs.second_factors is not None,
            "factor_names": SECOND_FACTOR_NAMES,
            "device_factors": {},  # device id -> the second factor its sign-in passed
            "sign_in_path": page.PATH,  # where signin.html's form goes
        }
        namespace.update(values)
        self.render(f"account/{template}", **namespace)

    def problem(self, status_code: int, exc: BaseException | None) -> HTTPProblem:
        """What the page says of an error: the services' table (account_page.page_error), or
        a sentence for what Tornado refused."""
        if not (isinstance(exc, HTTPError) or exc is None):
            return page_error(exc)
        message = page.SERVER_FAULT
        if status_code == 403 and isinstance(exc, HTTPError) and "xsrf" in (exc.log_message or "").lower():
            message = "This form came from another site, or has expired. Reload the page and try again."
        elif status_code == 404:
            message = "There is no such page."
        elif status_code == 405:
            message = "This page does not answer that method."
        elif 400 <= status_code < 500:
            message = "The request could not be understood."
        return PageError(status_code, message)

    def write_problem(self, problem: HTTPProblem) -> None:
        self.clear_header("Location")
        try:
            self.render_page("error.html", problem.status, message=problem.message, title="Error")
        except Exception:  # a template that cannot render must not hide the first error
            logger.exception("error page failed to render")
            self.finish(f"<!DOCTYPE html><title>Error</title><p>{problem.status}</p>")


class StylesheetHandler(RequestHandler):
    """The page's one stylesheet, read once."""

    FILE = STYLESHEET
    TYPE = "text/css; charset=UTF-8"
    _body: bytes | None = None

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", self.TYPE)
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Cache-Control", "public, max-age=3600")

    def get(self) -> None:
        cls = type(self)
        if cls._body is None:
            with open(cls.FILE, "rb") as fh:
                cls._body = fh.read()
        self.finish(cls._body)


class ScriptHandler(StylesheetHandler):
    """The project's one script (homeserver/static/webauthn.js: the passkey buttons), read once,
    from the pages' own origin: a page with a passkey button allows `script-src 'self'`."""

    FILE = WEBAUTHN_JS
    TYPE = "text/javascript; charset=UTF-8"
    _body = None
