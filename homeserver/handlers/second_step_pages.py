"""The sign-in's second step (`/account/second-step`, under /account/ so the page's cookies
reach it): HTML, no JavaScript but the passkey buttons' webauthn.js.

Every browser sign-in reaches it the same way: `PageHandler.form_sign_in` checked the
password, found that the person needs a second step (homeserver.mfa.policy), left a pending
sign-in (its signed cookie) and sent the browser here with `then`, the page it came from.
GET shows one form with one text input (a code of their app or a recovery code) and, for a
person with a passkey, a passkey button; for a person who must have a factor and has none,
the forms adding one (an authenticator app, a passkey). POST (XSRF checked) takes the pending
sign-in (once: a second POST at once, or later, is sent back to `then` without a session),
checks what was given (the service counts wrong codes per person and refuses a replay; when
it does not pass, the sign-in is pending again), opens the browser session marked with the
factor passed, and sends the person back to `then`.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from tornado.web import HTTPError

from backends.base import User
from backends.sessions.factors import RECOVERY, TOTP, WEBAUTHN
from homeserver import account_page as page
from homeserver.errors import PageError
from homeserver.handlers.page_base import PageHandler, ScriptHandler
from homeserver.mfa import second_step
from homeserver.mfa.second_step import SecondStep
from homeserver.mfa.service import (
    Added,
    EnrolmentExpired,
    Passed,
    PasskeyError,
    TooManyWrongCodes,
    TotpEnrolment,
    WrongCode,
)
from homeserver.names import user_id
from homeserver.oauth.clients import form_action_source
from homeserver.oauth.metadata import AUTHORIZATION_PATH

logger = logging.getLogger(__name__)

WRONG_CODE = "That code is not right, or it was used already. Type the code your app shows now."
PASSKEY_REFUSED = "The passkey could not be used. Try again, or type a code."
ENROLMENT_EXPIRED = "The page waited too long: scan this new code and type its first code."
SCRIPT = "/account/webauthn.js"


def too_many(exc: TooManyWrongCodes) -> PageError:
    retry = str(max(1, int(exc.retry_after + 0.999)))
    return PageError(429, f"Too many wrong codes. Try again in {retry} seconds.", {"Retry-After": retry})


def continue_to(then: str) -> tuple[str, list[tuple[str, str]]]:
    """A GET form's action and hidden fields going to `then` (a path of ours with its query)."""
    parts = urlsplit(then)
    return parts.path, parse_qsl(parts.query, keep_blank_values=True)


def going_on(then: str) -> str | None:
    """Where a form of this page may end up after `then`, beyond this site: the OAuth page
    back from the second step redirects the browser to its client with the code, and CSP's
    form-action holds for every redirect after a form (the client's redirect URI, checked
    when the sign-in began, as that page allows it on its own form)."""
    path, params = continue_to(then)
    redirect_uri = dict(params).get("redirect_uri")
    if path != AUTHORIZATION_PATH or not redirect_uri:
        return None
    return form_action_source(redirect_uri)


class SecondStepHandler(PageHandler):
    """GET: the second step of the pending sign-in. POST: a code, a passkey, or a factor added."""

    def step(self) -> SecondStep:
        if self.hs.second_step is None:
            raise HTTPError(404)
        return self.hs.second_step

    async def get(self) -> None:
        step = self.step()
        then = self.get_query_argument("then", "")
        if self.pending is None or self.pending_user is None:
            self.gone(then)
            return
        await self.show(step, self.pending_user, step.then(self.pending, then))

    def gone(self, then: str, status: int = 200) -> None:
        """No sign-in waits here (it expired, ended, or never began): someone signed in goes on,
        anyone else starts again where they began."""
        target = then if second_step.ours(then) else page.PATH
        if self.user is not None and status == 200:
            self.redirect(target, status=303)
            return
        self.render_page("second_step.html", status, mode="gone", again=target, title="Sign in again")

    async def show(
        self, step: SecondStep, user: User, then: str, *, problem: PageError | None = None,
        enrolment: TotpEnrolment | None = None,
    ) -> None:
        """The step's page: the code and passkey forms, or the forms adding a first factor."""
        self.allow_going_on(then)
        factors = step.factors
        values: dict[str, Any] = {
            "then": then, "path": second_step.PATH, "pending_id": user_id(user.name, self.hs.server_name),
            "passkey_action": second_step.PATH, "passkey_fields": [("then", then)], "passkey_options": None,
        }
        if await step.must_add(user):
            values.update(
                mode="add", title="Add a second factor", add_action=second_step.PATH, add_fields=[("then", then)],
                enrolment=enrolment or await factors.begin_totp(user.name), passkey_mode="create",
                passkey_op="add_passkey", passkey_label="Add a passkey",
            )
            if factors.relying_party is not None:
                values["passkey_options"] = await factors.begin_passkey(user.name, user.display_name or user.name)
        else:
            values.update(mode="check", title="Second step", passkey_mode="get", passkey_op="passkey",
                          passkey_label="Use a passkey instead")
            values["passkey_options"] = await factors.begin_passkey_check(user.name)
        if values["passkey_options"]:
            self.allow("script-src", "'self'")  # webauthn.js, from this origin; nothing inline
            values["script"] = SCRIPT
        self.render_page("second_step.html", problem=problem, **values)

    def allow_going_on(self, then: str) -> None:
        target = going_on(then)
        if target is not None:
            self.allow("form-action", target)

    async def post(self) -> None:
        step = self.step()
        then = self.get_body_argument("then", "")
        user, pending = self.pending_user, self.pending
        if user is None or pending is None:
            self.gone(then, 200 if self.user is not None else 401)  # signed in (sent twice): go on
            return
        target = step.then(pending, then)
        taken = await step.take(pending)
        if taken is None:
            # Finished already, or being finished, by another request of this browser (a double
            # click, a second tab): no second session; back where it began, signed in or not.
            self.clear_cookie(second_step.COOKIE)
            logger.info("%s: %s's second step was sent again; it is taken already", pending.reason, user.name)
            self.redirect(target, status=303)
            return
        op = self.get_body_argument("op", "")
        factors = step.factors
        enrolment: TotpEnrolment | None = None
        outcome: Passed | Added
        try:
            if op == "code":
                outcome = await factors.check_code(user.name, self.get_body_argument("code", ""))
            elif op == "passkey":
                outcome = await factors.finish_passkey_check(user.name, self.get_body_argument("credential", ""))
            elif op in ("add_app", "add_passkey") and await step.must_add(user):
                outcome = await self.add(step, user, op)
            else:
                raise PageError(400, "The request could not be understood.")
        except WrongCode:
            problem = PageError(403, WRONG_CODE)
            if op == "add_app":
                enrolment = await self.reopened(step, user)
        except TooManyWrongCodes as exc:
            problem = too_many(exc)
        except PasskeyError:
            problem = PageError(403, PASSKEY_REFUSED)
        except EnrolmentExpired:
            problem = PageError(400, ENROLMENT_EXPIRED)
        except PageError as exc:
            problem = exc
        else:
            await self.through(step, user, pending.reason, outcome, target)
            return
        await step.give_back(taken)
        await self.show(step, user, target, problem=problem, enrolment=enrolment)

    async def add(self, step: SecondStep, user: User, op: str) -> Added:
        if op == "add_app":
            return await step.factors.finish_totp(
                user.name, self.get_body_argument("pending", ""), self.get_body_argument("code", "")
            )
        return await step.factors.finish_passkey(user.name, self.get_body_argument("credential", ""))

    async def reopened(self, step: SecondStep, user: User) -> TotpEnrolment | None:
        """The app being added, shown again after a wrong first code (the same secret: the
        person's app has it already); None when it expired (a new one is shown)."""
        try:
            return await step.factors.reopen_totp(user.name, self.get_body_argument("pending", ""))
        except EnrolmentExpired:
            return None

    async def through(self, step: SecondStep, user: User, reason: str, outcome: Passed | Added, then: str) -> None:
        """Signed in: the browser session opened (marked with the factor), the pending sign-in
        gone; back to `then`, or first the new recovery codes, or how many are left."""
        kind = outcome.kind if isinstance(outcome, Passed) else outcome.factor.kind
        cookie = await step.finish(user, kind, self.client_ip, self.request.headers.get("User-Agent", ""))
        self.set_signed_cookie(page.COOKIE, cookie.encode(), max_age=page.LIFETIME)
        self.clear_cookie(second_step.COOKIE)
        self.set_signed_cookie(second_step.BACK_COOKIE, second_step.digest(then), max_age=second_step.BACK_LIFETIME)
        self.user, self.browser_session = user, cookie
        logger.info("%s: %s signed in with a second factor (%s)", reason, user.name, kind)
        values: dict[str, Any] = {"continue_to": continue_to(then), "kind": kind}
        self.allow_going_on(then)  # the Continue form below
        if isinstance(outcome, Added):
            self.render_page(
                "second_step.html", mode="added", codes=outcome.recovery_codes, title="Second factor added", **values
            )
        elif kind == RECOVERY:
            self.render_page("second_step.html", mode="recovery_used", left=outcome.recovery_left,
                             title="Recovery code used", **values)
        else:
            assert kind in (TOTP, WEBAUTHN)
            self.redirect(then, status=303)


ROUTES = [
    (second_step.PATH, SecondStepHandler),
    (SCRIPT.replace(".", r"\."), ScriptHandler),
]
