"""Capabilities and whoami: access tokens from the header or the query, and their failures."""

import base64
import json
import time

import pytest
from jose import jwt

from tests.support.helpers import JWT_SECRET, assert_error, assert_json
from tests.support.openapi import validate

CAPS = "/_matrix/client/v3/capabilities"
WHOAMI = "/_matrix/client/v3/account/whoami"


def forge(claims, key=JWT_SECRET, algorithm="HS256"):
    return jwt.encode(claims, key, algorithm=algorithm)


def b64(data: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


async def test_capabilities_document(fetch, login):
    token = (await login())["access_token"]
    resp = await fetch(CAPS, token=token)
    body = assert_json(resp)
    caps = body["capabilities"]
    for name in ("m.change_password", "m.set_displayname", "m.set_avatar_url", "m.3pid_changes", "m.get_login_token"):
        assert caps[name] == {"enabled": False}
    assert caps["m.room_versions"] == {"default": "10", "available": {str(v): "stable" for v in range(1, 12)}}
    validate(resp, "capabilities.yaml", "/capabilities")


async def test_token_in_the_query_parameter(fetch, login):
    token = (await login())["access_token"]
    assert "capabilities" in assert_json(await fetch(f"{CAPS}?access_token={token}"))
    assert assert_json(await fetch(f"{WHOAMI}?access_token={token}"))["user_id"] == "@alice:localhost"


async def test_whoami(fetch, login):
    token = (await login("bob", "builder"))["access_token"]
    resp = await fetch(WHOAMI, token=token)
    assert assert_json(resp) == {"user_id": "@bob:localhost", "device_id": "DUMMY"}
    validate(resp, "whoami.yaml", "/account/whoami")


@pytest.mark.parametrize("path", [CAPS, WHOAMI])
async def test_missing_token_is_401_missing_token(fetch, path):
    resp = await fetch(path)
    assert_error(resp, 401, "M_MISSING_TOKEN")


@pytest.mark.parametrize(
    "header",
    ["Basic YWxpY2U6d29uZGVybGFuZA==", "Bearer", "Bearer ", "Token abc", "bearer"],
)
async def test_malformed_authorization_header_is_401_missing_token(fetch, header):
    assert_error(await fetch(CAPS, headers={"Authorization": header}), 401, "M_MISSING_TOKEN")


async def test_header_and_query_together_are_refused(fetch, login):
    token = (await login())["access_token"]
    resp = await fetch(f"{CAPS}?access_token={token}", token=token)
    assert_error(resp, 401, "M_MISSING_TOKEN")


def _bad_tokens():
    good = forge({"sub": "alice", "device_id": "DUMMY"})
    head, payload, sig = good.split(".")
    return {
        "garbage": "not-a-token",
        "slashes": "an/invalid/token",
        "tampered payload": f"{head}.{b64({'sub': 'bob', 'device_id': 'DUMMY'})}.{sig}",
        "tampered signature": f"{head}.{payload}.{sig[:-2]}AA",
        "other key": forge({"sub": "alice", "device_id": "DUMMY"}, "another-secret-of-at-least-32-bytes!!"),
        "HS512": forge({"sub": "alice", "device_id": "DUMMY"}, algorithm="HS512"),
        "alg none": f"{b64({'alg': 'none', 'typ': 'JWT'})}.{payload}.",
        "alg HS2": f"{b64({'alg': 'HS2', 'typ': 'JWT'})}.{payload}.{sig}",
        "expired": forge({"sub": "alice", "device_id": "DUMMY", "exp": int(time.time()) - 10}),
        "no sub": forge({"device_id": "DUMMY"}),
        "sub not a string": forge({"sub": ["alice"], "device_id": "DUMMY"}),
        "no device": forge({"sub": "alice"}),
        "user gone": forge({"sub": "ghost", "device_id": "DUMMY"}),
        "payload a list": f"{head}.{base64.urlsafe_b64encode(b'[1]').decode().rstrip('=')}.{sig}",
        "huge": "a." * 10_000,
    }


@pytest.mark.parametrize("name, token", list(_bad_tokens().items()))
@pytest.mark.parametrize("path", [CAPS, WHOAMI])
async def test_bad_tokens_are_401_unknown_token(fetch, name, token, path):
    body = assert_error(await fetch(path, token=token), 401, "M_UNKNOWN_TOKEN")
    # An expired token is the one soft logout (decisions.md): the client keeps its device.
    assert body["soft_logout"] is (name == "expired")


async def test_bad_token_in_query_is_unknown_token(fetch):
    assert_error(await fetch(f"{CAPS}?access_token=an/invalid/token"), 401, "M_UNKNOWN_TOKEN")
    assert_error(await fetch(f"{CAPS}?access_token=%FF%FE"), 401, "M_UNKNOWN_TOKEN")


async def test_a_forged_valid_token_without_a_session_is_refused_as_a_soft_logout(fetch):
    # Signed with the server's secret but never issued by a login: no session, so 401,
    # with soft_logout true (a client logs in again on the same device).
    token = forge({"sub": "bob", "device_id": "X"})
    body = assert_error(await fetch(WHOAMI, token=token), 401, "M_UNKNOWN_TOKEN")
    assert body["soft_logout"] is True
