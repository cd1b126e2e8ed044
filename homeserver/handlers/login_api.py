"""GET /login (the flows), POST /login (password and token logins) and the legacy clients'
browser sign-in's first step, GET /login/sso/redirect (MSC3824)."""

from __future__ import annotations

from urllib.parse import urlencode

from homeserver.errors import unrecognized
from homeserver.handlers.base import BaseHandler
from homeserver.handlers.body import BodyHandler
from homeserver.sso import ACTION, PAGE_PATH, REDIRECT_URL, UNSTABLE_ACTION, check_redirect_url, sso_action


class LoginHandler(BodyHandler):
    """GET: the login flows. POST: a password or token login (body bounded by BodyHandler)."""

    def get(self) -> None:
        self.finish(self.hs.documents.login_flows)

    async def post(self) -> None:
        self.write_json(await self.hs.login.login(self.body_bytes(), self.client_ip))


class SsoRedirectHandler(BaseHandler):
    """GET /login/sso/redirect[/{idpId}]?redirectUrl=URL[&action=login|register]: the URL
    checked first (a 400 Matrix error, never a page or a redirect, for a missing or refused
    one), then the browser goes to our page (handlers/sso_pages.py), which signs the person
    in and sends them back to URL with a login token. Any idpId leads there (our one identity
    provider; MAS ignores it too). Only with `[mfa]` or `[oauth]` on, as GET /login says."""

    def get(self, idp_id: str | None = None) -> None:
        if self.hs.login_tokens is None:
            raise unrecognized()
        url = self.get_query_argument(REDIRECT_URL, None)
        check_redirect_url(url)
        query = {REDIRECT_URL: url}
        action = sso_action(self.get_query_argument(ACTION, None), self.get_query_argument(UNSTABLE_ACTION, None))
        if action is not None:
            query[ACTION] = action
        # A path, not an address: the browser stays on the host the client named.
        self.redirect(PAGE_PATH + "?" + urlencode(query))


ROUTES = [
    (r"/_matrix/client/v3/login", LoginHandler),
    (r"/_matrix/client/(?:r0|v3)/login/sso/redirect/?", SsoRedirectHandler),
    (r"/_matrix/client/(?:r0|v3)/login/sso/redirect/([A-Za-z0-9_.~-]+)", SsoRedirectHandler),
]
