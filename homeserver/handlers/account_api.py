"""Authenticated account endpoints: capabilities and whoami."""

from __future__ import annotations

from homeserver.handlers.base import BaseHandler


class CapabilitiesHandler(BaseHandler):
    async def get(self) -> None:
        await self.authenticate()
        self.finish(self.hs.documents.capabilities)


class WhoamiHandler(BaseHandler):
    async def get(self) -> None:
        requester = await self.authenticate()
        self.write_json({"user_id": requester.user_id, "device_id": requester.device_id})


ROUTES = [
    (r"/_matrix/client/v3/capabilities", CapabilitiesHandler),
    (r"/_matrix/client/v3/account/whoami", WhoamiHandler),
]
