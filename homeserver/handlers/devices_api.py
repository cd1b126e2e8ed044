"""Logout, logout of every device, and the devices API (v1.12 logout.yaml, device_management.yaml)."""

from __future__ import annotations

from homeserver.devices import device_body, device_list, display_name_of
from homeserver.handlers.base import BaseHandler
from homeserver.handlers.body import BodyHandler

EMPTY = b"{}"


class LogoutHandler(BodyHandler):
    """POST /logout: ends the token's session. Whatever body clients send is not parsed."""

    async def post(self) -> None:
        self.check_body_size()
        # A locked account may still sign out (v1.12 "Account locking").
        requester = await self.authenticate(allow_locked=True)
        await self.hs.devices.logout(requester.session)
        self.finish(EMPTY)


class LogoutAllHandler(BodyHandler):
    """POST /logout/all: ends every session of the user."""

    async def post(self) -> None:
        self.check_body_size()
        # A locked account may still sign out (v1.12 "Account locking").
        requester = await self.authenticate(allow_locked=True)
        await self.hs.devices.logout_all(requester.user.name)
        self.finish(EMPTY)


class DevicesHandler(BaseHandler):
    async def get(self) -> None:
        requester = await self.authenticate()
        devices = await self.hs.devices.list_devices(requester.user.name)
        self.write_json({"devices": [device_body(d) for d in devices]})


class DeviceHandler(BodyHandler):
    async def get(self, device_id: str) -> None:
        requester = await self.authenticate()
        self.write_json(device_body(await self.hs.devices.get(requester.user.name, device_id)))

    async def put(self, device_id: str) -> None:
        requester = await self.authenticate()
        await self.hs.devices.rename(requester.user.name, device_id, display_name_of(self.json_body()))
        self.finish(EMPTY)

    async def delete(self, device_id: str) -> None:
        requester = await self.authenticate()
        body = self.json_body(optional=True)
        await self.hs.devices.delete(requester, body, [device_id])
        self.finish(EMPTY)


class DeleteDevicesHandler(BodyHandler):
    async def post(self) -> None:
        requester = await self.authenticate()
        body = self.json_body()
        await self.hs.devices.delete(requester, body, device_list(body))
        self.finish(EMPTY)


ROUTES = [
    (r"/_matrix/client/v3/logout", LogoutHandler),
    (r"/_matrix/client/v3/logout/all", LogoutAllHandler),
    (r"/_matrix/client/v3/devices", DevicesHandler),
    (r"/_matrix/client/v3/devices/([^/]+)", DeviceHandler),
    (r"/_matrix/client/v3/delete_devices", DeleteDevicesHandler),
]
