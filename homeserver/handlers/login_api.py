"""GET /login (the flows) and POST /login (password login)."""

from __future__ import annotations

from homeserver.handlers.body import BodyHandler


class LoginHandler(BodyHandler):
    """GET: the login flows. POST: a password login (body bounded by BodyHandler)."""

    def get(self) -> None:
        self.finish(self.hs.documents.login_flows)

    async def post(self) -> None:
        self.write_json(await self.hs.login.login(self.body_bytes(), self.client_ip))


ROUTES = [
    (r"/_matrix/client/v3/login", LoginHandler),
]
