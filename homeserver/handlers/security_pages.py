"""The account page's security page (`/account/security`, with `[mfa]` on): a person's second
factors listed, an authenticator app or a passkey added, one removed, recovery codes renewed.
HTML under the account page's base; no JavaScript but the passkey buttons' webauthn.js.

Views (GET `?add=`): the list; `app` (the QR code as inline SVG, the `otpauth://` link, the
secret as text, one form whose one text input takes the app's first code); `passkey` (a
button asking the browser for a new passkey). POST (XSRF checked) runs one form (`op`):
`sign_in` (this page's own sign-in, through the second step), `add_app`, `add_passkey`,
`remove` and `renew`, the last two only with the password again, or a code of the person's
app or a recovery code.
"""

from __future__ import annotations

import logging
from typing import Any

from tornado.web import HTTPError

from backends.base import User
from backends.sessions.factors import RECOVERY
from homeserver import account_page as page
from homeserver.account_page import BrowserSessionCookie, page_error
from homeserver.errors import MatrixError, PageError
from homeserver.handlers.page_base import WHY_SIGNED_OUT, PageHandler
from homeserver.handlers.second_step_pages import PASSKEY_REFUSED, SCRIPT, WRONG_CODE, too_many
from homeserver.mfa.second_step import SecondStep
from homeserver.mfa.service import (
    Added,
    EnrolmentExpired,
    LastFactor,
    PasskeyError,
    SecondFactors,
    TooManyWrongCodes,
    TotpEnrolment,
    WrongCode,
)

logger = logging.getLogger(__name__)

PATH = "/account/security"
CURRENT = "security"  # the menu's mark for this page
AUDIT_REASON = "account page, security"
CONFIRM_WITH = "Type your password, or a code of your authenticator app, to confirm."
LAST_REQUIRED = "Your account must have a second factor: add another one before you remove this one."


class SecurityPageHandler(PageHandler):
    """GET: the list, or the view adding an app or a passkey. POST: one form, then the page again."""

    def step(self) -> SecondStep:
        if self.hs.second_step is None:
            raise HTTPError(404)
        return self.hs.second_step

    @property
    def factors(self) -> SecondFactors:
        return self.step().factors

    async def get(self) -> None:
        self.step()
        notice = self.take_flash()
        if self.user is None:
            self.signed_out(200, notice)
            return
        adding = self.get_query_argument("add", "")
        if adding == "app":
            await self.add_app_view(self.user)
        elif adding == "passkey" and self.factors.relying_party is not None:
            await self.add_passkey_view(self.user)
        else:
            await self.show(self.user, notice=notice)

    def signed_out(self, status: int, notice: str | None = None, **values: Any) -> None:
        why = WHY_SIGNED_OUT.get(self.signed_out_why or "")
        self.render_page(
            "signin.html", status, action="", device_id=None, notice=notice or why, title="Sign in",
            sign_in_path=PATH, **values,
        )

    async def show(self, user: User, status: int = 200, **values: Any) -> None:
        """The list of the person's factors, with the forms removing one or renewing the codes."""
        found = await self.factors.factors(user.name)
        values.setdefault("notice", None)
        values.setdefault("codes", [])
        self.render_page(
            "security.html", status, factors=[f for f in found if f.kind != RECOVERY],
            recovery=next((f for f in found if f.kind == RECOVERY), None), path=PATH, current=CURRENT,
            passkeys=self.factors.relying_party is not None, title="Security", **values,
        )

    async def add_app_view(self, user: User, enrolment: TotpEnrolment | None = None, **values: Any) -> None:
        self.render_page(
            "security_add.html", adding="app", enrolment=enrolment or await self.factors.begin_totp(user.name),
            add_action=PATH, add_fields=[], current=CURRENT, title="Add an authenticator app", **values,
        )

    async def add_passkey_view(self, user: User, **values: Any) -> None:
        self.allow("script-src", "'self'")  # webauthn.js, from this origin; nothing inline
        self.render_page(
            "security_add.html", adding="passkey", current=CURRENT, title="Add a passkey", script=SCRIPT,
            passkey_options=await self.factors.begin_passkey(user.name, user.display_name or user.name),
            passkey_mode="create", passkey_op="add_passkey", passkey_action=PATH, passkey_fields=[],
            passkey_label="Add a passkey", **values,
        )

    async def post(self) -> None:
        self.step()
        op = self.get_body_argument("op", "")
        if op == "sign_in":
            await self.sign_in()
            return
        if self.user is None or self.browser_session is None:
            self.signed_out(401, "Sign in to continue.")
            return
        user, browser = self.user, self.browser_session
        if op == "add_app":
            await self.add_app(user, browser)
        elif op == "add_passkey" and self.factors.relying_party is not None:
            await self.add_passkey(user, browser)
        elif op in ("remove", "renew"):
            await self.confirmed_change(user, op)
        else:
            raise PageError(400, "The request could not be understood.")

    async def sign_in(self) -> None:
        name = self.get_body_argument("name", "").strip()
        try:
            user = await self.form_sign_in(name, self.get_body_argument("password", ""), AUDIT_REASON, PATH)
        except PageError as said:
            self.signed_out(said.status, problem=said, name=name)
            return
        if user is not None:  # else the second step's page is next, and comes back here
            self.redirect(PATH, status=303)

    # -- adding -------------------------------------------------------------------------------

    async def add_app(self, user: User, browser: BrowserSessionCookie) -> None:
        pending = self.get_body_argument("pending", "")
        try:
            added = await self.factors.finish_totp(user.name, pending, self.get_body_argument("code", ""))
        except WrongCode:
            try:
                enrolment: TotpEnrolment | None = await self.factors.reopen_totp(user.name, pending)
            except EnrolmentExpired:
                enrolment = None
            await self.add_app_view(user, enrolment, problem=PageError(403, WRONG_CODE))
            return
        except EnrolmentExpired:
            await self.add_app_view(user, problem=PageError(400, "The page waited too long: scan this new code."))
            return
        await self.added(user, browser, added)

    async def add_passkey(self, user: User, browser: BrowserSessionCookie) -> None:
        try:
            added = await self.factors.finish_passkey(user.name, self.get_body_argument("credential", ""))
        except PasskeyError:
            await self.add_passkey_view(user, problem=PageError(403, PASSKEY_REFUSED))
            return
        await self.added(user, browser, added)

    async def added(self, user: User, browser: BrowserSessionCookie, added: Added) -> None:
        """The page after a factor was added: the recovery codes of a first factor, once. A
        browser session of before the person had one is opened again, marked with it (the
        person has just used it), so that it still counts (PageHandler's rule). Once: of two
        tabs adding their first factors at once, the one that ends the old session gives the
        new cookie; the other's new session is ended and the browser keeps the first's."""
        kind = added.factor.kind
        logger.info("account page: %s added a second factor (%s)", user.name, kind)
        if not browser.second_factor:
            cookie = await self.step().finish(user, kind, self.client_ip, self.request.headers.get("User-Agent", ""))
            if await self.hs.browser_sessions.end(user.name, browser.nonce):
                self.set_signed_cookie(page.COOKIE, cookie.encode(), max_age=page.LIFETIME)
                self.browser_session = cookie
            else:  # ended already: by the other tab, or a sign-out
                await self.hs.browser_sessions.end(user.name, cookie.nonce)
        notice = f"{'Authenticator app' if kind == 'totp' else 'Passkey'} added."
        await self.show(user, notice=notice, codes=added.recovery_codes)

    # -- removing, renewing -------------------------------------------------------------------

    async def confirmed_change(self, user: User, op: str) -> None:
        """`remove` or `renew`, once the password (or a code) was given again."""
        problem = await self.confirm(user)
        if problem is not None:
            await self.show(user, problem=problem)
            return
        if op == "renew":
            codes = await self.factors.renew_recovery_codes(user.name)
            logger.info("account page: %s made new recovery codes", user.name)
            await self.show(user, notice="New recovery codes: the old ones no longer work.", codes=codes)
            return
        factor_id = self.get_body_argument("factor_id", "")
        try:
            removed = await self.factors.remove(user.name, factor_id, keep_one=self.step().policy.must_have(user))
        except LastFactor:
            await self.show(user, problem=PageError(409, LAST_REQUIRED))
            return
        if not removed:
            await self.show(user, 404, error="That second factor is removed already.")
            return
        logger.info("account page: %s removed a second factor", user.name)
        self.flash("factor_removed")
        self.redirect(PATH, status=303)

    async def confirm(self, user: User) -> PageError | None:
        """None when the form carries the person's password, or a good code; else what to say."""
        password, code = self.get_body_argument("password", ""), self.get_body_argument("code", "").strip()
        try:
            if password:
                await self.account_page.confirm_password(user, password, self.client_ip)
            elif code:
                await self.factors.check_code(user.name, code)
            else:
                return PageError(400, CONFIRM_WITH)
        except MatrixError as exc:
            return page_error(exc, refused=page.WRONG_PASSWORD)
        except WrongCode:
            return PageError(403, WRONG_CODE)
        except TooManyWrongCodes as exc:
            return too_many(exc)
        return None


ROUTES = [
    (PATH, SecurityPageHandler),
]
