"""HEAD is answered wherever GET is: the same status and headers, no body."""

from __future__ import annotations

import pytest

from homeserver.app import make_app
from homeserver.handlers.base import BaseHandler
from tests.support.helpers import CORS

# Headers that differ between any two responses.
VARYING = {"Date", "X-Request-Id"}


class PostOnlyHandler(BaseHandler):
    def post(self) -> None:
        self.write_json({})


@pytest.fixture
def config_overrides():
    return {"metrics": {"enabled": True}}


@pytest.fixture
def app(hs):
    app = make_app(hs)
    app.add_handlers(r".*", [(r"/post-only", PostOnlyHandler)])
    return app


def same_headers(get, head) -> None:
    def kept(resp):
        return {k: v for k, v in resp.headers.get_all() if k not in VARYING}

    assert kept(head) == kept(get), (get, head)


@pytest.mark.parametrize(
    "path",
    [
        "/health",
        "/health/ready",
        "/.well-known/matrix/client",
        "/.well-known/matrix/support",
        "/support.html",
        "/_matrix/client/versions",
        "/_matrix/client/v3/login",
        "/_matrix/client/v3/profile/@alice:localhost",
        "/_matrix/client/v3/profile/@alice:localhost/displayname",
        "/_matrix/client/v3/profile/@nobody:localhost",  # a 404 from the handler
        "/_matrix/client/v3/capabilities",  # 401 without a token
        "/nowhere",  # the default handler's 404
    ],
)
async def test_head_answers_like_get_without_a_body(fetch, path):
    get = await fetch(path)
    head = await fetch(path, "HEAD")
    assert head.status == get.status, head
    assert head.body == b"", head
    assert int(head.headers["Content-Length"]) == len(get.body) > 0
    same_headers(get, head)


async def test_head_on_metrics(fetch):
    # The exposition changes with every request (it counts them), so only its shape is compared.
    get, head = await fetch("/metrics"), await fetch("/metrics", "HEAD")
    assert (get.status, head.status, head.body) == (200, 200, b"")
    assert head.headers["Content-Type"] == get.headers["Content-Type"]
    assert int(head.headers["Content-Length"]) > 0


async def test_head_with_a_token(fetch, login):
    token = (await login())["access_token"]
    for path in ("/_matrix/client/v3/account/whoami", "/_matrix/client/v3/capabilities"):
        get, head = await fetch(path, token=token), await fetch(path, "HEAD", token=token)
        assert (get.status, head.status, head.body) == (200, 200, b"")
        same_headers(get, head)


async def test_head_on_the_devices(fetch, login):
    body = await login(device_id="PHONE")
    for path in ("/_matrix/client/v3/devices", "/_matrix/client/v3/devices/PHONE", "/_matrix/client/v3/devices/NONE"):
        get = await fetch(path, token=body["access_token"])
        head = await fetch(path, "HEAD", token=body["access_token"])
        assert (head.status, head.body) == (get.status, b""), head
        assert head.headers["Content-Type"] == "application/json" and int(head.headers["Content-Length"]) > 0


@pytest.mark.parametrize("path", ["/_matrix/client/v3/logout", "/_matrix/client/v3/delete_devices"])
async def test_head_on_a_post_only_endpoint_is_405(fetch, path):
    resp = await fetch(path, "HEAD")
    assert resp.status == 405 and resp.body == b"", resp


async def test_head_where_there_is_no_get_is_405(fetch):
    resp = await fetch("/post-only", "HEAD")
    assert resp.status == 405 and resp.body == b"", resp
    for name, value in CORS.items():
        assert resp.headers[name] == value
    assert resp.headers["Content-Type"] == "application/json"
    assert (await fetch("/post-only", "POST")).status == 200
