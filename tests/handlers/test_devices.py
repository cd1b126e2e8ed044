"""The devices API, and device deletion behind User-Interactive Auth (m.login.password)."""

from __future__ import annotations

import base64

import pytest

from tests.support.helpers import assert_error, assert_json
from tests.support.openapi import validate

WHOAMI = "/_matrix/client/v3/account/whoami"
DEVICES = "/_matrix/client/v3/devices"
DELETE_DEVICES = "/_matrix/client/v3/delete_devices"
KEYS = {"device_id", "display_name", "last_seen_ip", "last_seen_ts"}


def password_auth(session=None, password="wonderland", user="alice"):
    auth = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user}, "password": password}
    if session is not None:
        auth["session"] = session
    return auth


async def test_devices_list_every_key_never_null(fetch, login):
    await login(device_id="PHONE", initial_device_display_name="Alice's phone")
    token = (await login())["access_token"]
    resp = await fetch(DEVICES, token=token)
    body = assert_json(resp)
    validate(resp, "device_management.yaml", "/devices")
    devices = {d["device_id"]: d for d in body["devices"]}
    assert set(devices) == {"PHONE", "DUMMY"}
    for device in devices.values():
        assert set(device) == KEYS, device
        assert isinstance(device["last_seen_ts"], int) and device["last_seen_ts"] > 0
        assert device["last_seen_ip"] == "127.0.0.1"
    assert devices["PHONE"]["display_name"] == "Alice's phone"
    assert devices["DUMMY"]["display_name"] == ""


async def test_a_second_login_on_a_device_keeps_its_name(fetch, login):
    await login(device_id="PHONE", initial_device_display_name="First")
    token = (await login(device_id="PHONE", initial_device_display_name="Second"))["access_token"]
    assert assert_json(await fetch(f"{DEVICES}/PHONE", token=token))["display_name"] == "First"


async def test_one_device(fetch, login):
    token = (await login(device_id="PHONE"))["access_token"]
    resp = await fetch(f"{DEVICES}/PHONE", token=token)
    assert set(assert_json(resp)) == KEYS
    validate(resp, "device_management.yaml", "/devices/{deviceId}")
    assert_error(await fetch(f"{DEVICES}/NOPE", token=token), 404, "M_NOT_FOUND")
    # Another user's device is nobody's for this user.
    await login("bob", "builder", device_id="BOBS")
    assert_error(await fetch(f"{DEVICES}/BOBS", token=token), 404, "M_NOT_FOUND")


async def test_device_ids_with_odd_characters_round_trip(fetch, login):
    token = (await login(device_id="a b/ü"))["access_token"]
    body = assert_json(await fetch(f"{DEVICES}/a%20b%2F%C3%BC", token=token))
    assert body["device_id"] == "a b/ü"


async def test_rename_a_device(fetch, login):
    token = (await login(device_id="PHONE"))["access_token"]
    resp = await fetch(f"{DEVICES}/PHONE", "PUT", token=token, json_body={"display_name": "Work phone"})
    assert resp.status == 200 and resp.json == {}, resp
    validate(resp, "device_management.yaml", "/devices/{deviceId}", "PUT")
    assert assert_json(await fetch(f"{DEVICES}/PHONE", token=token))["display_name"] == "Work phone"
    # No display_name: nothing changes.
    assert_json(await fetch(f"{DEVICES}/PHONE", "PUT", token=token, json_body={}))
    assert assert_json(await fetch(f"{DEVICES}/PHONE", token=token))["display_name"] == "Work phone"


@pytest.mark.parametrize(
    "body, status, errcode",
    [
        ({"display_name": 5}, 400, "M_INVALID_PARAM"),
        ({"display_name": "x" * 101}, 400, "M_INVALID_PARAM"),
        ([1], 400, "M_BAD_JSON"),
        ("{", 400, "M_NOT_JSON"),
    ],
)
async def test_rename_refuses_bad_bodies(fetch, login, body, status, errcode):
    token = (await login(device_id="PHONE"))["access_token"]
    if isinstance(body, str):
        resp = await fetch(f"{DEVICES}/PHONE", "PUT", token=token, body=body)
    else:
        resp = await fetch(f"{DEVICES}/PHONE", "PUT", token=token, json_body=body)
    assert_error(resp, status, errcode)


async def test_rename_an_unknown_device_is_404(fetch, login):
    token = (await login())["access_token"]
    resp = await fetch(f"{DEVICES}/NOPE", "PUT", token=token, json_body={"display_name": "x"})
    assert_error(resp, 404, "M_NOT_FOUND")
    assert_error(await fetch(f"{DEVICES}/NOPE", "PUT", token=token, json_body={}), 404, "M_NOT_FOUND")


async def test_devices_need_a_token(fetch):
    assert_error(await fetch(DEVICES), 401, "M_MISSING_TOKEN")
    assert_error(await fetch(f"{DEVICES}/X"), 401, "M_MISSING_TOKEN")
    assert_error(await fetch(DELETE_DEVICES, "POST", json_body={"devices": []}), 401, "M_MISSING_TOKEN")


async def test_delete_device_walks_through_uia(fetch, login):
    lost = (await login(device_id="LOST"))["access_token"]
    lost_too = (await login(device_id="LOST"))["access_token"]
    token = (await login(device_id="HERE"))["access_token"]

    # Step 1: no auth -> 401 with flows, params and session, and no errcode.
    resp = await fetch(f"{DEVICES}/LOST", "DELETE", token=token)
    first = assert_json(resp, 401)
    assert "errcode" not in first
    assert first["flows"] == [{"stages": ["m.login.password"]}] and first["params"] == {}
    session = first["session"]
    assert isinstance(session, str) and session
    validate(resp, "device_management.yaml", "/devices/{deviceId}", "DELETE")

    # Step 2: a wrong password -> 401 M_FORBIDDEN with the flows again.
    resp = await fetch(f"{DEVICES}/LOST", "DELETE", token=token, json_body={"auth": password_auth(session, "nope")})
    body = assert_error(resp, 401, "M_FORBIDDEN")
    assert body["flows"] == [{"stages": ["m.login.password"]}] and body["session"] == session
    validate(resp, "device_management.yaml", "/devices/{deviceId}", "DELETE")
    assert assert_json(await fetch(WHOAMI, token=lost))

    # Step 3: the right password ends every session of that device, only that device.
    resp = await fetch(f"{DEVICES}/LOST", "DELETE", token=token, json_body={"auth": password_auth(session)})
    assert resp.status == 200 and resp.json == {}, resp
    for dead in (lost, lost_too):
        body = assert_error(await fetch(WHOAMI, token=dead), 401, "M_UNKNOWN_TOKEN")
        assert body["soft_logout"] is False
    assert assert_json(await fetch(WHOAMI, token=token))["device_id"] == "HERE"
    assert [d["device_id"] for d in assert_json(await fetch(DEVICES, token=token))["devices"]] == ["HERE"]
    # Deleted before: still 200, as v1.12 says.
    resp = await fetch(f"{DEVICES}/LOST", "DELETE", token=token, json_body={"auth": password_auth()})
    assert resp.status == 200 and resp.json == {}, resp


async def test_delete_devices_in_bulk(fetch, login):
    a = (await login(device_id="A"))["access_token"]
    b = (await login(device_id="B"))["access_token"]
    token = (await login(device_id="KEEP"))["access_token"]
    body = {"devices": ["A", "B", "NEVER"]}
    resp = await fetch(DELETE_DEVICES, "POST", token=token, json_body=body)
    first = assert_json(resp, 401)
    assert "errcode" not in first
    validate(resp, "device_management.yaml", "/delete_devices", "POST")
    body["auth"] = password_auth(first["session"])
    resp = await fetch(DELETE_DEVICES, "POST", token=token, json_body=body)
    assert resp.status == 200 and resp.json == {}, resp
    validate(resp, "device_management.yaml", "/delete_devices", "POST")
    for dead in (a, b):
        assert_error(await fetch(WHOAMI, token=dead), 401, "M_UNKNOWN_TOKEN")
    assert assert_json(await fetch(WHOAMI, token=token))


async def test_deleting_the_own_device_ends_the_own_token(fetch, login):
    token = (await login(device_id="SELF"))["access_token"]
    resp = await fetch(f"{DEVICES}/SELF", "DELETE", token=token, json_body={"auth": password_auth()})
    assert resp.status == 200, resp
    assert_error(await fetch(WHOAMI, token=token), 401, "M_UNKNOWN_TOKEN")


@pytest.mark.parametrize(
    "body, status, errcode",
    [
        ({}, 400, "M_MISSING_PARAM"),
        ({"devices": "A"}, 400, "M_INVALID_PARAM"),
        ({"devices": [1]}, 400, "M_INVALID_PARAM"),
        ({"devices": ["A"], "auth": "x"}, 400, "M_INVALID_PARAM"),
        ({"devices": ["A"], "auth": {"type": "m.login.password", "session": 5}}, 400, "M_INVALID_PARAM"),
        ({"devices": ["A"], "auth": {"type": "m.login.password", "session": "forged.x"}}, 400, "M_UNKNOWN"),
        ({"devices": ["A"], "auth": {"type": "m.login.password"}}, 400, "M_MISSING_PARAM"),
        ({"devices": ["A"], "auth": {"type": "m.login.password", "password": 5}}, 400, "M_INVALID_PARAM"),
        ({"devices": ["A"], "auth": {"type": "m.login.dummy"}}, 401, "M_UNRECOGNIZED"),
    ],
)
async def test_delete_devices_refuses_bad_bodies(fetch, login, body, status, errcode):
    token = (await login())["access_token"]
    assert_error(await fetch(DELETE_DEVICES, "POST", token=token, json_body=body), status, errcode)
    assert assert_json(await fetch(WHOAMI, token=token))


async def test_a_session_of_one_operation_cannot_complete_another(fetch, login):
    await login(device_id="A")
    token = (await login(device_id="B"))["access_token"]
    first = assert_json(await fetch(DELETE_DEVICES, "POST", token=token, json_body={"devices": ["A"]}), 401)
    body = {"devices": ["A", "B"], "auth": password_auth(first["session"])}
    assert_error(await fetch(DELETE_DEVICES, "POST", token=token, json_body=body), 400, "M_UNKNOWN")
    assert assert_json(await fetch(WHOAMI, token=token))


async def test_another_users_password_is_403(fetch, login):
    token = (await login(device_id="A"))["access_token"]
    body = {"devices": ["A"], "auth": password_auth(password="builder", user="bob")}
    assert_error(await fetch(DELETE_DEVICES, "POST", token=token, json_body=body), 403, "M_FORBIDDEN")
    assert assert_json(await fetch(WHOAMI, token=token))


@pytest.mark.parametrize("config_overrides", [{"rate_limit": {"failed_attempts_burst": 2}}])
async def test_wrong_passwords_count_against_the_failed_login_limit(fetch, login, config_overrides):
    token = (await login(device_id="A"))["access_token"]
    body = {"devices": ["A"], "auth": password_auth(password="nope")}
    for _ in range(2):
        assert_error(await fetch(DELETE_DEVICES, "POST", token=token, json_body=body), 401, "M_FORBIDDEN")
    resp = await fetch(DELETE_DEVICES, "POST", token=token, json_body=body)
    error = assert_error(resp, 429, "M_LIMIT_EXCEEDED")
    assert error["retry_after_ms"] > 0 and resp.headers["Retry-After"]
    # The same limit guards the login.
    resp = await fetch("/_matrix/client/v3/login", "POST", json_body={"user": "alice", "password": "wonderland"})
    assert_error(resp, 429, "M_LIMIT_EXCEEDED")


@pytest.mark.parametrize("path, method", [(f"{DEVICES}/A", "PUT"), (f"{DEVICES}/A", "DELETE"), (DELETE_DEVICES, "POST")])
async def test_every_body_over_the_limit_is_413(fetch, login, hs, path, method):
    token = (await login(device_id="A"))["access_token"]
    big = b'{"devices": ["' + b"x" * hs.max_body_size + b'"]}'
    assert_error(await fetch(path, method, token=token, body=big), 413, "M_TOO_LARGE")

    def chunks(write):  # no Content-Length: counted as it arrives
        async def produce():
            for _ in range(4):
                await write(b" " * (hs.max_body_size // 2))
        return produce()

    if method != "DELETE":  # Tornado's client sends no chunked body with DELETE
        resp = await fetch(path, method, token=token, body_producer=chunks)
        assert_error(resp, 413, "M_TOO_LARGE")
    assert assert_json(await fetch(WHOAMI, token=token))  # nothing was deleted


@pytest.mark.parametrize(
    "session",
    ["", ".", "ä.ö", "!!!.???", base64.urlsafe_b64encode(b"[" * 30_000).decode() + ".AAAA", "a" * 10_000],
)
async def test_hostile_uia_sessions_are_400_never_500(fetch, login, session):
    token = (await login(device_id="A"))["access_token"]
    body = {"devices": ["A"], "auth": password_auth(session)}
    assert_error(await fetch(DELETE_DEVICES, "POST", token=token, json_body=body), 400, "M_UNKNOWN")
    assert assert_json(await fetch(WHOAMI, token=token))
