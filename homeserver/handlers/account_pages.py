"""The account page (`/account/`, the account_management_uri): HTML for people, not the JSON API.

These handlers share the API's request plumbing but not BaseHandler (handlers/page_base.py):
no CORS, no JSON errors, but a strict Content-Security-Policy, Tornado's XSRF check on every
form and the page's own browser session (its signed cookie). The logic is the services': the
page's own (`hs.account_page`), the login service's password check and `hs.devices`. API
paths keep their JSON errors.
"""

from __future__ import annotations

import logging
from typing import Any

from tornado.web import HTTPError

from backends.base import User
from homeserver import account_page as page
from homeserver.account_page import BrowserSessionCookie, page_error
from homeserver.devices import device_body, display_name_of
from homeserver.errors import MatrixError, PageError
from homeserver.handlers.page_base import NOTICES, WHY_SIGNED_OUT, PageHandler, StylesheetHandler, page_url
from homeserver.sessions import DEVICE_DELETED, LOGOUT_ALL

logger = logging.getLogger(__name__)


class AccountPageHandler(PageHandler):
    """GET shows the page an action names; POST runs one form (`op`) and redirects."""

    async def get(self) -> None:
        action = page.action_of(self.get_query_argument("action", None))
        device_id = self.get_query_argument("device_id", None) or None
        notice = self.take_flash()
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
            profile = self.account_page.profile_view(user)
            self.render_page("profile.html", status, profile=profile, notice=notice, title="Profile", **values)
            return
        if action == page.CROSS_SIGNING_RESET:
            self.render_page(
                "reset.html",
                status,
                delegation=self.account_page.delegation is not None,
                minutes=page.RESET_WINDOW_MINUTES,
                notice=notice,
                approved=notice == NOTICES["reset_allowed"],
                title="Reset cross-signing",
                **values,
            )
            return
        if action in (page.SESSION_VIEW, page.SESSION_END) and device_id is not None:
            device = await self.device(user, device_id)
            if device is None:
                error = f"You have no session {device_id!r}: it may be signed out already."
                await self.sessions_page(404, notice=notice, error=error)
                return
            template = "end.html" if action == page.SESSION_END else "session.html"
            others = [d for d in await self.hs.devices.list_devices(user.name) if d.device_id != device_id]
            title = "Sign out a session" if action == page.SESSION_END else "Session"
            self.render_page(template, status, device=device, others=len(others), notice=notice, title=title, **values)
            return
        await self.sessions_page(status, notice=notice, **values)

    async def sessions_page(self, status: int, **values: Any) -> None:
        """The sessions list: this page's own sign-ins (this browser marked) and the Matrix sessions."""
        user = self.user
        assert user is not None
        devices = await self.hs.devices.list_devices(user.name)
        values["devices"] = [device_body(device) for device in devices]
        values["device_factors"] = {device.device_id: device.second_factor for device in devices}
        values["browsers"] = await self.hs.browser_sessions.list_open(user.name)
        values["this_browser"] = self.browser_session.nonce if self.browser_session is not None else None
        values.setdefault("current", page.SESSIONS_LIST)
        self.render_page("sessions.html", status, title="Your sessions", **values)

    async def device(self, user: User, device_id: str) -> dict[str, Any] | None:
        """The user's device as the API shows it (and the second factor of its sign-in), or None
        when they have no such device."""
        try:
            device = await self.hs.devices.get(user.name, device_id)
            return {**device_body(device), "second_factor": device.second_factor}
        except MatrixError as exc:
            if exc.status == 404:
                return None
            raise

    async def post(self) -> None:
        op = self.get_body_argument("op", "")
        if op == "sign_in":
            await self.sign_in()
            return
        if self.user is None or self.browser_session is None:
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
        await handler(self.user, self.browser_session)

    def go(self, action: str | None = None, notice: str | None = None, **params: str | None) -> None:
        """303 to a page, with the outcome of the form (`notice`) in the flash cookie."""
        if notice is not None:
            self.flash(notice)
        self.redirect(page_url(action, **params), status=303)

    async def sign_in(self) -> None:
        name = self.get_body_argument("name", "").strip()
        password = self.get_body_argument("password", "")
        action = page.action_of(self.get_body_argument("action", None))
        device_id = self.get_body_argument("device_id", None) or None
        if action not in (page.SESSION_VIEW, page.SESSION_END):
            device_id = None
        try:
            user = await self.form_sign_in(name, password, page.AUDIT_REASON, page_url(action, device_id=device_id))
        except PageError as said:
            self.render_page(
                "signin.html", problem=said, action=action, device_id=device_id, name=name, title="Sign in"
            )
            return
        if user is not None:  # else the second step's page is next
            self.go(action, device_id=device_id)

    async def sign_out(self, user: User, browser_session: BrowserSessionCookie) -> None:
        await self.account_page.end(browser_session)
        self.clear_cookie(page.COOKIE)
        self.go(notice="signed_out")

    async def rename(self, user: User, browser_session: BrowserSessionCookie) -> None:
        device_id = self.get_body_argument("device_id", "")
        name = self.get_body_argument("display_name", "").strip()
        try:
            await self.hs.devices.rename(user.name, device_id, display_name_of({"display_name": name}))
        except MatrixError as exc:
            if exc.status >= 500:
                raise  # Synapse away: the error page says so
            # a name too long, no such device
            await self.show(page.SESSION_VIEW, device_id, problem=page_error(exc))
            return
        self.go(page.SESSION_VIEW, device_id=device_id, notice="renamed")

    async def end_one(self, user: User, browser_session: BrowserSessionCookie) -> None:
        device_id = self.get_body_argument("device_id", "")
        # A device the user does not have is a 404 before anything ends (with delegation,
        # nothing is asked of Synapse for it either).
        if await self.device(user, device_id) is None or not await self.hs.devices.end(
            user.name, [device_id], DEVICE_DELETED
        ):
            # Gone already (another tab, another client): say so on the list.
            await self.show(page.SESSION_VIEW, device_id)
            return
        logger.info("account page: %s signed out device %r", user.name, device_id)
        self.go(page.SESSIONS_LIST, notice="ended")

    async def end_others(self, user: User, browser_session: BrowserSessionCookie) -> None:
        """Every session but one: the one kept must be the user's (404 otherwise, as `end`),
        and ending sessions in bulk asks for the password, as signing out everywhere does."""
        keep = self.get_body_argument("device_id", "")
        if await self.device(user, keep) is None:
            await self.show(page.SESSION_VIEW, keep)
            return
        try:
            await self.account_page.confirm_password(user, self.get_body_argument("password", ""), self.client_ip)
        except MatrixError as exc:
            await self.show(page.SESSION_VIEW, keep, problem=page_error(exc, refused=page.WRONG_PASSWORD))
            return
        others = [d.device_id for d in await self.hs.devices.list_devices(user.name) if d.device_id != keep]
        if others:
            await self.hs.devices.end(user.name, others, DEVICE_DELETED)
        logger.info("account page: %s signed out %d devices but %r", user.name, len(others), keep)
        self.go(page.SESSION_VIEW, device_id=keep, notice="ended_others")

    async def end_all(self, user: User, browser_session: BrowserSessionCookie) -> None:
        try:
            await self.account_page.confirm_password(user, self.get_body_argument("password", ""), self.client_ip)
        except MatrixError as exc:
            await self.sessions_page(200, problem=page_error(exc, refused=page.WRONG_PASSWORD))
            return
        # Every session and every page sign-in, this one too (Devices.end: one audit line).
        await self.hs.devices.end(user.name, None, LOGOUT_ALL)
        self.clear_cookie(page.COOKIE)
        logger.info("account page: %s signed out everywhere", user.name)
        self.go(notice="signed_out_everywhere")

    async def approve_reset(self, user: User, browser_session: BrowserSessionCookie) -> None:
        try:
            await self.account_page.confirm_password(user, self.get_body_argument("password", ""), self.client_ip)
            await self.account_page.allow_cross_signing_reset(user)
        except (MatrixError, PageError) as exc:
            await self.show_reset_error(page_error(exc, refused=page.WRONG_PASSWORD))
            return
        logger.info("account page: %s approved a cross-signing reset", user.name)
        self.go(page.CROSS_SIGNING_RESET, notice="reset_allowed")

    async def show_reset_error(self, exc: PageError) -> None:
        self.render_page(
            "reset.html",
            problem=exc,
            current=page.CROSS_SIGNING_RESET,
            delegation=self.account_page.delegation is not None,
            minutes=page.RESET_WINDOW_MINUTES,
            approved=False,
            title="Reset cross-signing",
        )


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
