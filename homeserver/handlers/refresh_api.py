"""POST /refresh (Matrix v1.3+, refresh.yaml): new tokens for a refresh token (homeserver.refresh)."""

from __future__ import annotations

from homeserver.handlers.body import BodyHandler


class RefreshHandler(BodyHandler):
    """POST: a refresh token of a password login or of a Synapse moved here; no access token needed."""

    async def post(self) -> None:
        self.write_json(await self.hs.refresh.refresh(self.body_bytes(), self.client_ip))


ROUTES = [
    # r0 too, as Synapse served it (nginx routes both here under delegation).
    (r"/_matrix/client/(?:r0|v3)/refresh", RefreshHandler),
]
