"""A fake of Synapse's `/_synapse/mas/` API, in process, for the account page's reset approval.

Only the call the page makes (`allow_cross_signing_reset`) matters here; the real Synapse
behind nginx is the delegation end-to-end tests' business. `FakeDelegation` has the shape
of `hs.delegation` the page calls (`allow_cross_signing_reset(localpart)`).
"""

from __future__ import annotations

import json
from typing import Any

import tornado.web
from tornado.httpclient import AsyncHTTPClient

SECRET = "fake-synapse-shared-secret"


class Calls:
    def __init__(self) -> None:
        self.received: list[tuple[str, Any]] = []
        self.fail = False


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
        self.calls.received.append((call, json.loads(self.request.body)))
        self.finish({})


def fake_synapse_app(calls: Calls) -> tornado.web.Application:
    return tornado.web.Application([(r"/_synapse/mas/(\w+)", MasHandler, {"calls": calls})])


class FakeDelegation:
    """What the page needs of hs.delegation, calling the fake over HTTP as the real one would."""

    def __init__(self, synapse_url: str) -> None:
        self.synapse_url = synapse_url

    async def close(self) -> None:
        """Nothing to release (HomeServer.close calls it)."""

    async def allow_cross_signing_reset(self, localpart: str) -> None:
        await AsyncHTTPClient().fetch(
            self.synapse_url + "/_synapse/mas/allow_cross_signing_reset",
            method="POST",
            body=json.dumps({"localpart": localpart}),
            headers={"Authorization": f"Bearer {SECRET}", "Content-Type": "application/json"},
        )
