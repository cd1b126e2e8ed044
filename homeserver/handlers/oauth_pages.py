"""The authorization endpoint and its sign-in page (under /account/, so the account page's
cookie and XSRF cookie reach it): HTML for people, no JavaScript.

GET checks the request. The browser is sent to the client only with a code, after the
person signed in (or, signed in already, confirmed) on a page that showed where it goes:
anyone may register a client whose redirect is their own site (RFC 9700 4.11.2). Every
other outcome is a page of ours: no known client or a redirect URI it did not register, a
request this server does not answer (a bad scope, no PKCE, `prompt=none`), "Cancel". Once
the person is signed in, that page offers a link back to the client with the error, its
address shown, for the person to follow or not.

The sign-in page shows the client's name and where it will send the person, and asks for
the name and password, or, for a person signed in on the account page, only for a
confirmation. POST (XSRF checked) signs in through the same login service as the API
(names, e-mail addresses, the limits, the lock, the audit line), then sends the browser to
the client with the code.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlencode

from tornado.web import HTTPError

from backends.base import User
from homeserver.errors import PageError
from homeserver.handlers.page_base import PageHandler
from homeserver.oauth import OAuth
from homeserver.oauth.authorize import AuthorizationRequest, Redirect, RedirectError, single
from homeserver.oauth.errors import ACCESS_DENIED, OAuthError
from homeserver.oauth.metadata import AUTHORIZATION_PATH

logger = logging.getLogger(__name__)

# The audit trail's reason for a sign-in on this page (a login is audited with how it came).
AUDIT_REASON = "oauth sign-in"


class AuthorizeHandler(PageHandler):
    """GET: the checked request's sign-in (or confirmation) page. POST: sign in, confirm or deny."""

    def oauth(self) -> OAuth:
        if self.hs.oauth is None:
            raise HTTPError(404)
        return self.hs.oauth

    async def checked(self, params: dict[str, list[bytes]]) -> AuthorizationRequest | None:
        """The request, or None when an answer (error page or redirect) was already sent."""
        values = single({name: [v.decode("utf-8", "replace") for v in found] for name, found in params.items()})
        try:
            return await self.oauth().authorization.request(values)
        except PageError as exc:
            self.render_page(
                "oauth_error.html", problem=exc, message=exc.message, title="Cannot sign in",
                cancelled=False, back_url=None,
            )
        except RedirectError as exc:
            logger.info("oauth: authorization refused: %s", exc.error)
            message = f"{exc.client_name} sent a request this server does not answer: {exc.error.description}."
            self.answer_without_redirect(exc.redirect, exc.error, exc.client_name, PageError(400, message))
        return None

    def answer_without_redirect(
        self, redirect: Redirect, error: OAuthError, client_name: str, problem: PageError | None = None
    ) -> None:
        """The page of a request refused (`problem`) or cancelled: never a redirect to the client;
        for a person signed in, a link back to it with the error."""
        self.render_page(
            "oauth_error.html", 200, problem=problem, message=problem.message if problem else "",
            cancelled=problem is None, client_name=client_name, redirect_uri=redirect.redirect_uri,
            back_url=redirect.error(error) if self.user is not None else None,
            title="Cannot sign in" if problem else "Cancelled",
        )

    async def show(
        self, request: AuthorizationRequest, status: int = 200, *, signed_in_now: bool = False, **values: Any
    ) -> None:
        """The sign-in page, or for a person signed in the confirmation (`signed_in_now`: just
        signed in by its form, whose password `prompt=login` asked for), saying which session
        of theirs it replaces when the device named has one."""
        # The form may be redirected to the client (CSP form-action covers redirects).
        self.allow("form-action", request.redirect.form_target())
        user = self.user
        device_id = request.scope.device_id
        replaced = await self.oauth().grants.replaced(user.name, device_id) if user is not None else None
        params = request.params
        if signed_in_now:  # the password was just given: the confirmation does not ask it again
            params = {name: value for name, value in params.items() if name != "prompt"}
        values.setdefault("name", "")
        self.render_page(
            "oauth_authorize.html",
            status,
            params=params,
            client_name=request.client_name,
            client_uri=str(request.client.get("client_uri", "")),
            redirect_uri=request.redirect.redirect_uri,
            device_id=device_id,
            replaced=replaced,
            confirm=user is not None and (signed_in_now or not request.sign_in_asked),
            path=AUTHORIZATION_PATH,
            other_account=AUTHORIZATION_PATH + "?" + urlencode({**request.params, "prompt": "login"}),
            title=f"Sign in to {request.client_name}",
            **values,
        )

    async def get(self) -> None:
        request = await self.checked(self.request.query_arguments)
        if request is None:
            return
        if self.user is not None and self.back_from_second_step():
            # The sign-in of this very request, its second step just passed: as its form's POST.
            await self.signed_in(request, self.user)
            return
        await self.show(request)

    async def signed_in(self, request: AuthorizationRequest, user: User) -> None:
        """Just signed in on this page: the code, or first the confirmation when the device
        named has a session of theirs, which it would replace."""
        if await self.oauth().grants.replaced(user.name, request.scope.device_id) is not None:
            await self.show(request, signed_in_now=True)  # the page says which; the person confirms
            return
        await self.give_code(request, user)

    async def give_code(self, request: AuthorizationRequest, user: User) -> None:
        passed = self.browser_session.second_factor if self.browser_session is not None else ""
        target = await self.oauth().authorization.issue_code(request, user, second_factor=passed)
        logger.info("oauth: %s authorized client %s, device %s", user.name, request.client_id, request.scope.device_id)
        self.redirect(target, status=303)

    async def post(self) -> None:
        request = await self.checked(self.request.body_arguments)
        if request is None:
            return
        op = self.get_body_argument("op", "")
        if op == "deny":
            denied = OAuthError(ACCESS_DENIED, "the person did not allow it")
            self.answer_without_redirect(request.redirect, denied, request.client_name)
            return
        user = self.user
        if op == "sign_in":
            name = self.get_body_argument("name", "").strip()
            # Back here after a second step: the request, its password asked already.
            back = AUTHORIZATION_PATH + "?" + urlencode({k: v for k, v in request.params.items() if k != "prompt"})
            try:
                signed_in = await self.form_sign_in(name, self.get_body_argument("password", ""), AUDIT_REASON, back)
            except PageError as said:
                await self.show(request, problem=said, name=name)
                return
            if signed_in is not None:  # else the second step's page is next; it comes back here
                await self.signed_in(request, signed_in)
            return
        if op != "confirm" or user is None or request.sign_in_asked:
            await self.show(request, 401 if op == "confirm" else 400, error="Sign in to continue.")
            return
        await self.give_code(request, user)


ROUTES = [
    (AUTHORIZATION_PATH.replace(".", r"\."), AuthorizeHandler),
]
