"""The account page (`/account/`, the account_management_uri): HTML for people, not the JSON API.

These handlers do not inherit BaseHandler: no CORS, no JSON errors, but a strict
Content-Security-Policy, Tornado's XSRF check on every form and the page's own signed
cookie session (homeserver.account_page holds the logic). API paths keep their JSON errors.
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
from homeserver.account_page import PageError, PageSession, PageSessions
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

# What a redirect after a form may tell the next page: fixed texts chosen by key.
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

    @property
    def hs(self) -> HomeServer:
        return self.application.settings["homeserver"]

    @property
    def sessions(self) -> PageSessions:
        return PageSessions(self.settings["cookie_secret"], self.hs)

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


class AccountPageHandler(PageHandler):
    """GET shows the page an action names; POST runs one form (`op`) and redirects."""

    async def get(self) -> None:
        action = page.action_of(self.get_query_argument("action", None))
        device_id = self.get_query_argument("device_id", None) or None
        notice = NOTICES.get(self.get_query_argument("notice", ""))
        if self.user is None:
            why = WHY_SIGNED_OUT.get(self.signed_out_why or "")
            self.render_page("signin.html", action=action, device_id=device_id, notice=notice or why, title="Sign in")
            return
        await self.show(action, device_id, notice)

    async def show(
        self, action: str, device_id: str | None, notice: str | None = None, status: int = 200, **values: Any
    ) -> None:
        user = self.user
        assert user is not None
        values["current"] = action
        if action == page.PROFILE:
            profile = page.profile_view(self.hs, user)
            self.render_page("profile.html", status, profile=profile, notice=notice, title="Profile", **values)
            return
        if action == page.CROSS_SIGNING_RESET:
            self.render_page(
                "reset.html",
                status,
                delegation=page.delegation_of(self.hs) is not None,
                minutes=page.RESET_WINDOW_MINUTES,
                notice=notice,
                approved=notice == NOTICES["reset_allowed"],
                title="Reset cross-signing",
                **values,
            )
            return
        if action in (page.SESSION_VIEW, page.SESSION_END) and device_id is not None:
            device = await page.get_device(self.hs, user, device_id)
            if device is None:
                devices = await page.list_devices(self.hs, user)
                self.render_page(
                    "sessions.html", 404, devices=devices, notice=notice,
                    error=f"You have no session {device_id!r}: it may be signed out already.", title="Your sessions",
                )
                return
            template = "end.html" if action == page.SESSION_END else "session.html"
            others = [d for d in await page.list_devices(self.hs, user) if d["device_id"] != device_id]
            title = "Sign out a session" if action == page.SESSION_END else "Session"
            self.render_page(template, status, device=device, others=len(others), notice=notice, title=title, **values)
            return
        devices = await page.list_devices(self.hs, user)
        self.render_page("sessions.html", status, devices=devices, notice=notice, title="Your sessions", **values)

    async def post(self) -> None:
        op = self.get_body_argument("op", "")
        if op == "sign_in":
            await self.sign_in()
            return
        if self.user is None or self.session is None:
            why = WHY_SIGNED_OUT.get(self.signed_out_why or "", "Sign in to continue.")
            action = page.action_of(self.get_body_argument("action", None))
            device_id = self.get_body_argument("device_id", None) or None
            self.render_page("signin.html", 401, action=action, device_id=device_id, notice=why, title="Sign in")
            return
        handler = {
            "sign_out": self.sign_out,
            "rename": self.rename,
            "end": self.end_one,
            "end_others": self.end_others,
            "end_all": self.end_all,
            "reset": self.approve_reset,
        }.get(op)
        if handler is None:
            raise PageError(400, "The request could not be understood.")
        await handler(self.user, self.session)

    def go(self, action: str | None = None, **params: str | None) -> None:
        self.redirect(page_url(action, **params), status=303)

    async def sign_in(self) -> None:
        name = self.get_body_argument("name", "").strip()
        password = self.get_body_argument("password", "")
        action = page.action_of(self.get_body_argument("action", None))
        device_id = self.get_body_argument("device_id", None) or None
        try:
            user = await page.authenticate(self.hs, name, password, self.client_ip)
        except PageError as exc:
            for header, value in exc.headers.items():
                self.set_header(header, value)
            self.render_page(
                "signin.html", exc.status, action=action, device_id=device_id, error=exc.message, name=name,
                title="Sign in",
            )
            return
        session = self.sessions.new(user)
        self.set_signed_cookie(page.COOKIE, session.encode(), max_age=page.LIFETIME)
        logger.info("account page: %s signed in", user.name)
        self.go(action, device_id=device_id if action in (page.SESSION_VIEW, page.SESSION_END) else None)

    async def sign_out(self, user: User, session: PageSession) -> None:
        await self.sessions.end(session)
        self.clear_cookie(page.COOKIE)
        self.go(notice="signed_out")

    async def rename(self, user: User, session: PageSession) -> None:
        device_id = self.get_body_argument("device_id", "")
        name = self.get_body_argument("display_name", "").strip()
        try:
            await page.rename_device(self.hs, user, device_id, name)
        except MatrixError as exc:
            if exc.status >= 500:
                raise
            await self.show(page.SESSION_VIEW, device_id, status=exc.status, error=exc.message)
            return
        self.go(page.SESSION_VIEW, device_id=device_id, notice="renamed")

    async def end_one(self, user: User, session: PageSession) -> None:
        device_id = self.get_body_argument("device_id", "")
        if not await page.end_devices(self.hs, user, [device_id]):
            # Gone already (another tab, another client): say so on the list.
            await self.show(page.SESSION_VIEW, device_id)
            return
        logger.info("account page: %s signed out device %r", user.name, device_id)
        self.go(page.SESSIONS_LIST, notice="ended")

    async def end_others(self, user: User, session: PageSession) -> None:
        keep = self.get_body_argument("device_id", "")
        others = [d["device_id"] for d in await page.list_devices(self.hs, user) if d["device_id"] != keep]
        if others:
            await page.end_devices(self.hs, user, others)
        logger.info("account page: %s signed out %d devices but %r", user.name, len(others), keep)
        self.go(page.SESSION_VIEW, device_id=keep, notice="ended_others")

    async def end_all(self, user: User, session: PageSession) -> None:
        try:
            await page.confirm_password(self.hs, user, self.get_body_argument("password", ""), self.client_ip)
        except PageError as exc:
            for header, value in exc.headers.items():
                self.set_header(header, value)
            self.set_status(exc.status)
            devices = await page.list_devices(self.hs, user)
            self.render_page(
                "sessions.html", exc.status, devices=devices, error=exc.message, title="Your sessions",
                current=page.SESSIONS_LIST,
            )
            return
        await page.end_devices(self.hs, user, None)
        await self.sessions.end(session)
        self.clear_cookie(page.COOKIE)
        logger.info("account page: %s signed out everywhere", user.name)
        self.go(notice="signed_out_everywhere")

    async def approve_reset(self, user: User, session: PageSession) -> None:
        try:
            await page.confirm_password(self.hs, user, self.get_body_argument("password", ""), self.client_ip)
            await page.allow_cross_signing_reset(self.hs, user)
        except PageError as exc:
            for header, value in exc.headers.items():
                self.set_header(header, value)
            await self.show_reset_error(exc)
            return
        logger.info("account page: %s approved a cross-signing reset", user.name)
        self.go(page.CROSS_SIGNING_RESET, notice="reset_allowed")

    async def show_reset_error(self, exc: PageError) -> None:
        self.render_page(
            "reset.html",
            exc.status,
            current=page.CROSS_SIGNING_RESET,
            delegation=page.delegation_of(self.hs) is not None,
            minutes=page.RESET_WINDOW_MINUTES,
            approved=False,
            error=exc.message,
            title="Reset cross-signing",
        )


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


class AccountRedirectHandler(PageHandler):
    """/account without the slash: the page, its query kept."""

    async def prepare(self) -> None:
        pass

    def get(self) -> None:
        query = self.request.query
        self.redirect(page.PATH + ("?" + query if query else ""), permanent=True)


class PageNotFoundHandler(PageHandler):
    """Any other path under /account/: an HTML 404 (the API's unknown paths stay JSON)."""

    async def prepare(self) -> None:
        raise HTTPError(404)


ROUTES = [
    (r"/account/", AccountPageHandler),
    (r"/account", AccountRedirectHandler),
    (r"/account/style\.css", StylesheetHandler),
    (r"/account/.*", PageNotFoundHandler),
]
