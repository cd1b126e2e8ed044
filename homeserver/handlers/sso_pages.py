"""The legacy clients' browser sign-in page (MSC3824; HTML, under /account/ so the account
page's cookie and XSRF cookie reach it; no JavaScript). GET /login/sso/redirect
(handlers/login_api.py) checks the client's redirect URL and leads here.

Its steps, each a form whose first submit button goes on and whose second cancels: the
browser sign-in (`PageHandler.form_sign_in`: the account page's sign-in, its browser session,
and the second step after it for a person who has one), skipped by a person signed in
already; then "continue to <host>", which says where the browser will go; then the browser
goes there with `loginToken=…`. The page only asks whether a browser session stands (it
stands once its second step is done). Nothing is sent to the client before "Continue": a
cancel or a deny is a page of ours, never a redirect. Every form posts to this page's own
address (its query names the redirect URL), so that whatever comes between (the second
step) can send the person back to it.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlencode

from tornado.web import HTTPError

from homeserver.errors import MatrixError, PageError
from homeserver.handlers.page_base import PageHandler
from homeserver.sso import ACTION, PAGE_PATH, REDIRECT_URL, ClientRedirect, LoginTokens, check_redirect_url, sso_action

logger = logging.getLogger(__name__)

# The audit trail's reason for a sign-in on this page.
AUDIT_REASON = "sso sign-in"


class SsoPageHandler(PageHandler):
    """GET: the sign-in, or for a person signed in the "continue" page. POST (XSRF checked):
    sign in, continue (the login token made, the browser sent to the client) or cancel."""

    def login_tokens(self) -> LoginTokens:
        if self.hs.login_tokens is None:
            raise HTTPError(404)
        return self.hs.login_tokens

    def client_redirect(self) -> ClientRedirect:
        """The redirect URL of this page's query, checked again (a link may lead here directly)."""
        try:
            return check_redirect_url(self.get_query_argument(REDIRECT_URL, None))
        except MatrixError as exc:
            raise PageError(
                400, f"The application asked to send you to an address this server does not send anyone to "
                f"({exc.message}). Nothing was sent; start again from the application."
            ) from None

    def here(self, redirect: ClientRedirect, **extra: str) -> str:
        """This page's own address for `redirect` (its action kept)."""
        query = {REDIRECT_URL: redirect.url}
        action = sso_action(self.get_query_argument(ACTION, None))
        if action is not None:
            query[ACTION] = action
        return PAGE_PATH + "?" + urlencode({**query, **extra})

    def show(self, step: str, redirect: ClientRedirect, status: int = 200, **values: Any) -> None:
        if step == "continue":
            # "Continue" is answered by a redirect to the client (CSP form-action covers redirects).
            self.allow("form-action", redirect.form_target())
        values.setdefault("name", "")
        self.render_page(
            "sso.html",
            status,
            step=step,
            where=redirect.host if redirect.web else f"the application {redirect.host}",
            redirect_url=redirect.url,
            web=redirect.web,
            loopback=redirect.loopback,
            register=sso_action(self.get_query_argument(ACTION, None)) == "register",
            path=self.here(redirect),
            other_account=self.here(redirect, prompt="login"),
            title={"continue": "Continue", "denied": "Denied"}.get(step, "Sign in"),
            **values,
        )

    async def get(self) -> None:
        self.login_tokens()
        redirect = self.client_redirect()
        if self.user is None and self.request.headers.get("Sec-Fetch-Site") == "cross-site":
            # Come from another site (a web client's redirect), the browser kept the page's
            # SameSite=Strict cookie back: this page again, from itself, brings it.
            self.render_page("sso_bounce.html", target=self.here(redirect), title="Sign in")
            return
        if self.user is None or self.get_query_argument("prompt", "") == "login":  # "Not you?"
            self.show("sign_in", redirect)
        else:
            self.show("continue", redirect)

    async def post(self) -> None:
        login_tokens = self.login_tokens()
        redirect = self.client_redirect()
        op = self.get_body_argument("op", "")
        if op == "deny":
            self.show("denied", redirect)
            return
        if op == "sign_in":
            name = self.get_body_argument("name", "").strip()
            try:
                user = await self.form_sign_in(name, self.get_body_argument("password", ""), AUDIT_REASON,
                                               self.here(redirect))
            except PageError as said:
                self.show("sign_in", redirect, problem=said, name=name)
                return
            if user is not None:  # else the second step's page is next; it comes back here
                self.redirect(self.here(redirect), status=303)  # the "continue" page
            return
        if op != "continue":
            raise PageError(400, "The request could not be understood.")
        if self.user is None or self.browser_session is None:
            self.show("sign_in", redirect, 401, error="Sign in to continue.")
            return
        token = await login_tokens.issue(self.browser_session)  # its second factor goes on with it
        logger.info("sso: %s sent back to %s with a login token", self.user.name, redirect.host)
        self.redirect(redirect.with_token(token), status=303)


ROUTES = [
    (PAGE_PATH, SsoPageHandler),
]
