"""A fake of Synapse's `/_synapse/mas/` API, in process, for the account page's reset approval.

Only the call the page makes (`allow_cross_signing_reset`) matters here; the real Synapse
behind nginx is the delegation end-to-end tests' business. `FakeDelegation` has the shape
of `hs.delegation` the page calls (`allow_cross_signing_reset(localpart)`), through the real
Synapse client (homeserver.delegation.synapse).
"""

from __future__ import annotations

import json
from typing import Any

import tornado.web
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from homeserver.context import HomeServer
from homeserver.delegation.synapse import SynapseClient

SECRET = "fake-synapse-shared-secret"


class Calls:
    def __init__(self) -> None:
        self.received: list[tuple[str, Any]] = []
        self.fail = False
        self.unknown_users: set[str] = set()


class MasHandler(tornado.web.RequestHandler):
    def initialize(self, calls: Calls) -> None:
        self.calls = calls

    def post(self, call: str) -> None:
        if self.request.headers.get("Authorization") != f"Bearer {SECRET}":
            self.set_status(403)
            self.finish({"errcode": "M_UNKNOWN", "error": "This endpoint must only be called by MAS"})
            return
        if self.calls.fail:
            self.set_status(500)
            self.finish({"errcode": "M_UNKNOWN", "error": "Internal server error"})
            return
        body = json.loads(self.request.body)
        if body.get("localpart") in self.calls.unknown_users:
            self.set_status(404)
            self.finish({"errcode": "M_NOT_FOUND", "error": "User not found"})
            return
        self.calls.received.append((call, body))
        self.finish({})


def fake_synapse_app(calls: Calls) -> tornado.web.Application:
    return tornado.web.Application([(r"/_synapse/mas/(\w+)", MasHandler, {"calls": calls})])


class FakeDelegation:
    """What the page needs of hs.delegation: the real Synapse client, pointed at the fake."""

    def __init__(self, synapse_url: str) -> None:
        self.client = SynapseClient(synapse_url, SECRET, timeout=5.0)

    async def close(self) -> None:
        self.client.close()

    async def allow_cross_signing_reset(self, localpart: str) -> None:
        await self.client.allow_cross_signing_reset(localpart)


def serve_fake(hs: HomeServer, calls: Calls) -> HTTPServer:
    """Start the fake on a port of its own (on the running loop) and point hs.delegation, the
    account page's too, at it; the caller stops the server it returns."""
    sock, port = bind_unused_port()
    server = HTTPServer(fake_synapse_app(calls))
    server.add_sockets([sock])
    hs.delegation = hs.account_page.delegation = FakeDelegation(f"http://127.0.0.1:{port}")  # type: ignore[assignment]
    return server
