"""Logout, logout of every device, and the devices API (v1.12 logout.yaml, device_management.yaml)."""

from __future__ import annotations

from homeserver.devices import delete_devices, device_list
from homeserver.handlers.base import BaseHandler
from homeserver.handlers.body import BodyHandler
from homeserver.sessions import LOGOUT_ALL

EMPTY = b"{}"


class LogoutHandler(BodyHandler):
    """POST /logout: ends the token's session. Whatever body clients send is not parsed."""

    async def post(self) -> None:
        self.check_body_size()
        requester = await self.authenticate()
        await self.hs.sessions.logout(requester.session)
        self.finish(EMPTY)


class LogoutAllHandler(BodyHandler):
    """POST /logout/all: ends every session of the user."""

    async def post(self) -> None:
        self.check_body_size()
        requester = await self.authenticate()
        await self.hs.sessions.end_devices(requester.user.name, None, LOGOUT_ALL)
        self.finish(EMPTY)


class DevicesHandler(BaseHandler):
    async def get(self) -> None:
        requester = await self.authenticate()
        self.write_json(await self.hs.sessions.devices(requester.user.name))


class DeviceHandler(BodyHandler):
    async def get(self, device_id: str) -> None:
        requester = await self.authenticate()
        self.write_json(await self.hs.sessions.device(requester.user.name, device_id))

    async def put(self, device_id: str) -> None:
        requester = await self.authenticate()
        await self.hs.sessions.rename_device(requester.user.name, device_id, self.json_body())
        self.finish(EMPTY)

    async def delete(self, device_id: str) -> None:
        requester = await self.authenticate()
        body = self.json_body(optional=True)
        await delete_devices(self.hs.sessions, self.hs.uia, requester, body, [device_id])
        self.finish(EMPTY)


class DeleteDevicesHandler(BodyHandler):
    async def post(self) -> None:
        requester = await self.authenticate()
        body = self.json_body()
        await delete_devices(self.hs.sessions, self.hs.uia, requester, body, device_list(body))
        self.finish(EMPTY)


ROUTES = [
    (r"/_matrix/client/v3/logout", LogoutHandler),
    (r"/_matrix/client/v3/logout/all", LogoutAllHandler),
    (r"/_matrix/client/v3/devices", DevicesHandler),
    (r"/_matrix/client/v3/devices/([^/]+)", DeviceHandler),
    (r"/_matrix/client/v3/delete_devices", DeleteDevicesHandler),
]
