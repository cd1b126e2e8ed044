"""The account page's base handler: HTML for people, not the JSON API.

Pages do not inherit BaseHandler: no CORS, no JSON errors, but a strict
Content-Security-Policy, Tornado's XSRF check on every form and the page's own signed
cookie session (homeserver.account_page holds the logic). Also the page's stylesheet.
"""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from tornado.web import HTTPError, RequestHandler

from backends.base import User
from homeserver import account_page as page
from homeserver import audit, request_id
from homeserver.account_page import PageError, PageSession, PageSignIns
from homeserver.context import HomeServer
from homeserver.errors import MatrixError, StoreUnavailable
from homeserver.logs import scrub_uri

logger = logging.getLogger(__name__)

TEMPLATES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "templates")
STYLESHEET = os.path.join(TEMPLATES, "account", "style.css")

SECURITY_HEADERS = (
    (
        "Content-Security-Policy",
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'",
    ),
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


class PageHandler(RequestHandler):
    """HTML pages: security headers, HTML errors, XSRF on every POST, the page session loaded."""

    user: User | None = None
    session: PageSession | None = None
    signed_out_why: str | None = None
    _client_ip: str | None = None
    _request_id: str | None = None
    _sign_ins: PageSignIns | None = None

    @property
    def hs(self) -> HomeServer:
        return self.application.settings["homeserver"]

    @property
    def sessions(self) -> PageSignIns:
        if self._sign_ins is None:
            self._sign_ins = PageSignIns(self.settings["cookie_secret"], self.hs)
        return self._sign_ins

    @property
    def secure(self) -> bool:
        return str(self.hs.config.get("server", "base_url")).startswith("https://")

    def initialize(self) -> None:
        self.hs.inflight.add(self)

    def on_finish(self) -> None:
        self.hs.inflight.discard(self)

    def on_connection_close(self) -> None:
        super().on_connection_close()
        self.hs.inflight.discard(self)

    @property
    def client_ip(self) -> str:
        if self._client_ip is None:
            self._client_ip = self.hs.client_address(self.request)
        return self._client_ip

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", HTML_TYPE)
        for name, value in SECURITY_HEADERS:
            self.set_header(name, value)
        if self._request_id is None:
            peer = self.request.remote_ip or ""
            trusted = self.hs.client_address.is_trusted(peer) if self.hs.client_address.networks else False
            self._request_id = request_id.choose(self.request.headers.get(request_id.HEADER), trusted)
            request_id.begin(self._request_id)
        self.set_header(request_id.HEADER, self._request_id)
        if self.hs.inflight.draining:
            self.set_header("Connection", "close")

    def compute_etag(self) -> None:
        return None

    def get_template_path(self) -> str:
        return TEMPLATES

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
        cookie = PageSession.decode(raw.decode("utf-8", "replace")) if raw is not None else None
        self.user, self.signed_out_why = await self.sessions.check(cookie)
        if self.user is not None:
            self.session = cookie
        elif self.get_cookie(page.COOKIE):
            # Past its lifetime, tampered with, or no longer standing: gone from the browser too.
            self.signed_out_why = self.signed_out_why or "expired"
            self.clear_cookie(page.COOKIE)

    # -- rendering ------------------------------------------------------------------

    def render_page(self, template: str, status: int = 200, **values: Any) -> None:
        self.set_status(status)
        user = self.user
        namespace: dict[str, Any] = {
            "user": user,
            "user_id": f"@{user.name}:{self.hs.server_name}" if user is not None else "",
            "server_name": self.hs.server_name,
            "session": self.session,
            "expires": when(self.sessions.expires(self.session) * 1000) if self.session is not None else "",
            "notice": None,
            "error": None,
            "page_url": page_url,
            "when": when,
            "iso": iso,
            "actions": page,
            "title": "Your account",
            "current": None,
            "name": "",
        }
        namespace.update(values)
        self.render(f"account/{template}", **namespace)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = "Something went wrong on the server. Try again later."
        if isinstance(exc, PageError):
            status_code, message = exc.status, exc.message
            for name, value in exc.headers.items():
                self.set_header(name, value)
        elif isinstance(exc, StoreUnavailable):
            status_code, message = 503, page.STORE_DOWN
            self.set_header("Retry-After", "5")
        elif isinstance(exc, MatrixError):
            status_code, message = exc.status, exc.message
            for name, value in exc.headers.items():
                self.set_header(name, value)
        elif isinstance(exc, HTTPError) and status_code == 403 and "xsrf" in (exc.log_message or "").lower():
            message = "This form came from another site, or has expired. Reload the page and try again."
        elif status_code == 404:
            message = "There is no such page."
        elif status_code == 405:
            message = "This page does not answer that method."
        elif 400 <= status_code < 500:
            message = "The request could not be understood."
        self.clear_header("Location")
        try:
            self.render_page("error.html", status_code, message=message, title="Error")
        except Exception:  # a template that cannot render must not hide the first error
            logger.exception("error page failed to render")
            self.finish(f"<!DOCTYPE html><title>Error</title><p>{status_code}</p>")

    def log_exception(self, typ: Any, value: BaseException | None, tb: Any) -> None:
        if isinstance(value, (PageError, HTTPError, MatrixError)):
            return
        if isinstance(value, StoreUnavailable):
            logger.warning("%s unavailable: %s", value.store, value)
            return
        uri = scrub_uri(self.request.uri or "")
        logger.error("uncaught exception in %s %s", self.request.method, uri, exc_info=(typ, value, tb))  # type: ignore[arg-type]


class StylesheetHandler(RequestHandler):
    """The page's one stylesheet, read once."""

    _css: bytes | None = None

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "text/css; charset=UTF-8")
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Cache-Control", "public, max-age=3600")

    def get(self) -> None:
        if StylesheetHandler._css is None:
            with open(STYLESHEET, "rb") as fh:
                StylesheetHandler._css = fh.read()
        self.finish(StylesheetHandler._css)
