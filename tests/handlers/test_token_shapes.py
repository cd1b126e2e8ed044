"""No token makes a 500: a header of deeply nested JSON (python-jose's RecursionError) and other
shapes no token of ours has are 401 M_UNKNOWN_TOKEN on every authenticated endpoint, and
`active: false` at introspection, with no traceback in the log."""

from __future__ import annotations

import base64
import logging
from urllib.parse import quote

import pytest

from tests.support.delegation_fakes import SECRET
from tests.support.helpers import assert_error, assert_json

pytestmark = pytest.mark.usefixtures("io_loop")

V3 = "/_matrix/client/v3"
AUTHENTICATED = [
    ("GET", V3 + "/account/whoami"),
    ("GET", V3 + "/capabilities"),
    ("GET", V3 + "/devices"),
    ("GET", V3 + "/devices/PHONE"),
    ("PUT", V3 + "/devices/PHONE"),
    ("DELETE", V3 + "/devices/PHONE"),
    ("POST", V3 + "/delete_devices"),
    ("POST", V3 + "/logout"),
    ("POST", V3 + "/logout/all"),
]


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


HOSTILE = [
    # Nested JSON in the header, within the length a token may have.
    ".".join([b64(b"[" * 2000 + b"]" * 2000), b64(b"{}"), b64(b"sig")]),
    ".".join([b64(b'{"alg":' + b"[" * 1500 + b"]" * 1500 + b"}"), b64(b"{}"), b64(b"sig")]),
    # The same past it.
    ".".join([b64(b"[" * 10_000 + b"]" * 10_000), b64(b"{}"), b64(b"sig")]),
    # A JSON array where the header's object goes.
    ".".join([b64(b"[]"), b64(b"{}"), b64(b"sig")]),
]


def no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert bad == [], [r.getMessage() for r in bad]


@pytest.mark.parametrize("token", HOSTILE, ids=["nested", "nested-value", "nested-long", "array"])
async def test_every_authenticated_endpoint_answers_401(fetch, caplog, token):
    caplog.set_level(logging.DEBUG)
    for method, path in AUTHENTICATED:
        body = "{}" if method in ("POST", "PUT", "DELETE") else None
        resp = await fetch(path, method, body=body, token=token)
        assert_error(resp, 401, "M_UNKNOWN_TOKEN")
        resp = await fetch(path + "?access_token=" + quote(token), method, body=body)
        assert_error(resp, 401, "M_UNKNOWN_TOKEN")
    no_traceback(caplog)


async def test_good_tokens_still_work(fetch, login):
    token = (await login())["access_token"]
    assert_json(await fetch(V3 + "/account/whoami", token=token))


class TestIntrospection:
    @pytest.fixture
    def config_overrides(self, synapse):
        return {"delegation": synapse.section()}

    @pytest.mark.parametrize("token", HOSTILE, ids=["nested", "nested-value", "nested-long", "array"])
    async def test_inactive(self, fetch, caplog, token):
        caplog.set_level(logging.DEBUG)
        headers = {"Authorization": f"Bearer {SECRET}", "Content-Type": "application/x-www-form-urlencoded"}
        body = "token=" + quote(token) + "&token_type_hint=access_token"
        resp = await fetch("/oauth2/introspect", "POST", body=body, headers=headers)
        assert assert_json(resp) == {"active": False}
        no_traceback(caplog)
