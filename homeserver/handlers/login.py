"""GET /login (the flows) and POST /login (password login)."""

from __future__ import annotations

from homeserver.handlers.body import BodyHandler
from homeserver.login import login, login_outcome, parse_login


class LoginHandler(BodyHandler):
    """GET: the login flows. POST: a password login (body bounded by BodyHandler)."""

    def get(self) -> None:
        self.finish(self.hs.documents.login_flows)

    async def post(self) -> None:
        metrics = self.hs.metrics
        try:
            response = await self._login()
        except Exception as exc:
            if metrics is not None:
                metrics.observe_login(login_outcome(exc))
            raise
        if metrics is not None:
            metrics.observe_login(login_outcome(None))
        self.write_json(response)

    async def _login(self) -> dict[str, str]:
        await self.hs.limits.check_address(self.client_ip)
        request = parse_login(self.json_body(), self.hs.server_name)
        return await login(
            request,
            users=self.hs.users,
            tokens=self.hs.tokens,
            checker=self.hs.checker,
            server_name=self.hs.server_name,
            limits=self.hs.limits,
            sessions=self.hs.sessions,
            client_ip=self.client_ip,
        )


ROUTES = [
    (r"/_matrix/client/v3/login", LoginHandler),
]
