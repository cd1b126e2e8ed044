"""An in-process stand-in for Synapse's `/_synapse/mas/` API, for the delegation's fast tests.

It keeps users and devices as Synapse would (upsert 201/200, delete 204, sync, 404 M_NOT_FOUND
for an unknown user), records every call, and can misbehave on demand: answer 500, hang,
send a body that is not JSON or one too large, refuse the secret (403), have no such API (404
M_UNRECOGNIZED), or be down altogether (`stop()`, then `start()` again on the same port).
The real Synapse behind nginx is the end-to-end tests' business (tests/delegation/test_synapse*).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from typing import Any

import tornado.web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

SECRET = "synapse-shared-secret-0123456789abcdef"
MODES = ("ok", "error", "hang", "garbage", "huge", "wrong_secret", "no_api")


class FakeSynapse:
    """Users, devices and a log of calls; `mode` (or `modes[call]`) says how it answers."""

    def __init__(self, secret: str = SECRET, server_name: str = "localhost") -> None:
        self.secret = secret
        self.server_name = server_name
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.users: dict[str, dict[str, Any]] = {}
        self.devices: dict[str, dict[str, str | None]] = {}
        self.mode = "ok"
        self.modes: dict[str, str] = {}
        self.port = 0
        self._server: HTTPServer | None = None
        self._release = asyncio.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        sockets = bind_sockets(self.port, "127.0.0.1", family=socket.AF_INET)
        self.port = sockets[0].getsockname()[1]
        self._release = asyncio.Event()
        app = tornado.web.Application([(r"/_synapse/mas/([a-z_]+)", MasHandler, {"fake": self})])
        self._server = HTTPServer(app)
        self._server.add_sockets(sockets)

    async def stop(self) -> None:
        """Down: connections refused until `start()`."""
        self._release.set()
        if self._server is not None:
            self._server.stop()
            await self._server.close_all_connections()
            self._server = None

    def section(self, **more: Any) -> dict[str, Any]:
        """A `[delegation]` section pointed at this fake, with a short timeout; `more` adds keys."""
        return {"enabled": True, "synapse_url": self.url, "secret": self.secret, "timeout": 0.5, **more}

    def names(self) -> list[str]:
        """The calls made so far, by name."""
        return [name for name, _ in self.calls]

    def mode_of(self, call: str) -> str:
        return self.modes.get(call, self.mode)


class MasHandler(tornado.web.RequestHandler):
    def initialize(self, fake: FakeSynapse) -> None:
        self.fake = fake

    def _answer(self, status: int, body: Any = None) -> None:
        self.set_status(status)
        if status != 204:
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps(body if body is not None else {}))
        else:
            self.finish()

    def _error(self, status: int, errcode: str, error: str) -> None:
        self._answer(status, {"errcode": errcode, "error": error})

    async def get(self, call: str) -> None:
        await self._handle(call, {k: v[0].decode() for k, v in self.request.query_arguments.items()})

    async def post(self, call: str) -> None:
        await self._handle(call, json.loads(self.request.body or b"{}"))

    async def _handle(self, call: str, body: dict[str, Any]) -> None:
        fake = self.fake
        auth = self.request.headers.get("Authorization")
        mode = fake.mode_of(call)
        if mode == "no_api":
            return self._error(404, "M_UNRECOGNIZED", "Unrecognized request")
        if auth is None:
            return self._error(401, "M_MISSING_TOKEN", "Missing access token")
        if auth != f"Bearer {fake.secret}" or mode == "wrong_secret":
            return self._error(403, "M_UNKNOWN", "This endpoint must only be called by MAS")
        if mode == "hang":
            await fake._release.wait()
            return self._error(500, "M_UNKNOWN", "released")
        if mode == "error":
            return self._error(500, "M_UNKNOWN", "Internal server error")
        if mode == "garbage":
            self.set_status(200)
            return self.finish(b"<html>not json")
        if mode == "huge":  # a JSON answer over the client's 1 MiB bound
            self.set_status(200)
            return self.finish(b'{"x": "' + b"x" * (2 << 20) + b'"}')
        fake.calls.append((call, body))
        localpart = body.get("localpart", "")
        user = fake.users.get(localpart)
        if call == "provision_user":
            if localpart != localpart.lower():  # Synapse's check_username
                return self._error(400, "M_INVALID_USERNAME", "User ID may not contain upper-case letters")
            created = user is None
            user = fake.users.setdefault(localpart, {})
            for key in ("displayname", "avatar_url", "emails"):
                if body.get(f"unset_{key}"):
                    user.pop(key, None)
                elif f"set_{key}" in body:
                    user[key] = body[f"set_{key}"]
            if "locked" in body:
                user["locked"] = body["locked"]
            fake.devices.setdefault(localpart, {})
            return self._answer(201 if created else 200)
        if user is None:
            return self._error(404, "M_NOT_FOUND", "User not found")
        devices = fake.devices[localpart]
        if call == "query_user":
            return self._answer(
                200,
                {
                    "user_id": f"@{localpart}:{fake.server_name}",
                    "display_name": user.get("displayname"),
                    "avatar_url": user.get("avatar_url"),
                    "is_suspended": False,
                    "is_deactivated": bool(user.get("deactivated")),
                },
            )
        if call == "delete_user":  # Synapse's deactivation: devices and addresses go, the profile stays
            user["deactivated"] = True
            user.pop("emails", None)
            devices.clear()
            return self._answer(200)
        if call == "reactivate_user":
            user["deactivated"] = False
            return self._answer(200)
        if call == "upsert_device":
            created = body["device_id"] not in devices
            if created or body.get("display_name") is not None:
                devices[body["device_id"]] = body.get("display_name")
            return self._answer(201 if created else 200)
        if call == "delete_device":
            devices.pop(body["device_id"], None)
            return self._answer(204)
        if call == "sync_devices":
            wanted = set(body["devices"])
            for device in set(devices) - wanted:
                del devices[device]
            for device in wanted - set(devices):
                devices[device] = None
            return self._answer(200)
        if call == "update_device_display_name":
            if body["device_id"] not in devices:
                return self._error(404, "M_NOT_FOUND", "Device not found")
            devices[body["device_id"]] = body["display_name"]
            return self._answer(200)
        if call == "allow_cross_signing_reset":
            return self._answer(200)
        return self._error(404, "M_UNRECOGNIZED", "Unrecognized request")


class FakeSynapseThread:
    """The fake on an event loop of its own thread, for tests that drive `run.py` processes
    with blocking calls. `fake` is read from the test's thread (the lists and dicts only grow
    or change under the GIL); `down()` and `up()` stop and restart it on the same port."""

    def __init__(self, secret: str = SECRET) -> None:
        self.fake = FakeSynapse(secret)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fake-synapse", daemon=True)
        self.thread.start()
        self.up()

    @property
    def url(self) -> str:
        return self.fake.url

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def up(self) -> None:
        async def start() -> None:
            self.fake.start()

        self._run(start())

    def down(self) -> None:
        self._run(self.fake.stop())

    def close(self) -> None:
        self.down()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
