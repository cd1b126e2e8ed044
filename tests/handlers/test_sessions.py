"""Sessions over HTTP: a session per login, logout, logout/all, and what a dead token is told."""

from __future__ import annotations

import pytest

from homeserver.sessions import token_digest
from tests.support.helpers import assert_error, assert_json
from tests.support.openapi import validate

WHOAMI = "/_matrix/client/v3/account/whoami"
CAPS = "/_matrix/client/v3/capabilities"
LOGOUT = "/_matrix/client/v3/logout"
LOGOUT_ALL = "/_matrix/client/v3/logout/all"
DEVICES = "/_matrix/client/v3/devices"


async def assert_dead(fetch, token, soft_logout=False):
    for path in (WHOAMI, CAPS):
        body = assert_error(await fetch(path, token=token), 401, "M_UNKNOWN_TOKEN")
        assert body["soft_logout"] is soft_logout


async def test_each_login_gets_a_distinct_token_with_the_same_claims(fetch, login):
    from jose import jwt

    a, b = (await login())["access_token"], (await login())["access_token"]
    assert a != b
    assert jwt.get_unverified_claims(a) == jwt.get_unverified_claims(b) == {"sub": "alice", "device_id": "DUMMY"}


async def test_logout_ends_the_token_from_the_next_request_on(fetch, login):
    token = (await login())["access_token"]
    assert assert_json(await fetch(WHOAMI, token=token))["user_id"] == "@alice:localhost"
    resp = await fetch(LOGOUT, "POST", token=token)
    assert resp.status == 200 and resp.body == b"{}", resp
    assert_json(resp)
    validate(resp, "logout.yaml", "/logout", "POST")
    await assert_dead(fetch, token)
    # A second logout with the dead token is refused too; it never comes back.
    assert_error(await fetch(LOGOUT, "POST", token=token), 401, "M_UNKNOWN_TOKEN")
    await assert_dead(fetch, token)


@pytest.mark.parametrize(
    "body, headers",
    [
        (None, {}),
        (b"", {"Content-Type": "application/json"}),
        (b"{}", {"Content-Type": "application/json"}),
        (b"not json at all", {"Content-Type": "text/plain"}),  # not parsed
    ],
)
@pytest.mark.parametrize("path", [LOGOUT, LOGOUT_ALL])
async def test_logout_takes_whatever_body_clients_send(fetch, login, body, headers, path):
    token = (await login())["access_token"]
    resp = await fetch(path, "POST", token=token, body=body, headers=headers)
    assert resp.status == 200 and resp.body == b"{}", resp


async def test_logout_of_one_dummy_client_leaves_the_others(fetch, login):
    first, second = (await login())["access_token"], (await login())["access_token"]
    assert_json(await fetch(LOGOUT, "POST", token=first))
    await assert_dead(fetch, first)
    assert assert_json(await fetch(WHOAMI, token=second))["device_id"] == "DUMMY"
    devices = assert_json(await fetch(DEVICES, token=second))["devices"]
    assert [d["device_id"] for d in devices] == ["DUMMY"]


async def test_logout_all_ends_every_session_of_the_user_only(fetch, login):
    phone = (await login(device_id="PHONE"))["access_token"]
    laptop = (await login(device_id="LAPTOP"))["access_token"]
    dummy = (await login())["access_token"]
    bob = (await login("bob", "builder"))["access_token"]
    resp = await fetch(LOGOUT_ALL, "POST", token=laptop)
    assert resp.status == 200 and resp.body == b"{}", resp
    validate(resp, "logout.yaml", "/logout/all", "POST")
    for token in (phone, laptop, dummy):
        await assert_dead(fetch, token)
    assert assert_json(await fetch(WHOAMI, token=bob))["user_id"] == "@bob:localhost"


@pytest.mark.parametrize("path", [LOGOUT, LOGOUT_ALL])
async def test_logout_needs_a_token(fetch, path):
    assert_error(await fetch(path, "POST"), 401, "M_MISSING_TOKEN")
    assert_error(await fetch(path, "POST", token="garbage"), 401, "M_UNKNOWN_TOKEN")


@pytest.mark.parametrize("path", [LOGOUT, LOGOUT_ALL])
async def test_logout_is_post_only(fetch, login, path):
    token = (await login())["access_token"]
    assert_error(await fetch(path, token=token), 405, "M_UNRECOGNIZED")


async def test_logout_body_over_the_limit_is_413(fetch, login, hs):
    token = (await login())["access_token"]
    resp = await fetch(LOGOUT, "POST", token=token, body=b"x" * (hs.max_body_size + 1))
    assert_error(resp, 413, "M_TOO_LARGE")
    assert assert_json(await fetch(WHOAMI, token=token))  # not logged out


async def test_a_removed_user_loses_their_sessions_at_once_and_rows_are_swept(fetch, login, hs, io_loop):
    token = (await login("bob", "builder"))["access_token"]
    backend = hs.backend
    users = dict(backend.users)
    del users["bob"]
    backend._install(backend.signature, users)
    await assert_dead(fetch, token)
    assert "bob" in await hs.sessions.store.users()
    # Missing in one sweep could be a passing glitch of the store: only the second ends them.
    assert await hs.devices.sweep_removed_users(hs.users) == 0
    assert await hs.devices.sweep_removed_users(hs.users) == 1
    assert "bob" not in await hs.sessions.store.users()


async def test_the_store_keeps_no_token_text(fetch, login, hs, tmp_path):
    token = (await login(device_id="PHONE", initial_device_display_name="Phone"))["access_token"]
    assert_json(await fetch(LOGOUT, "POST", token=(await login())["access_token"]))
    _head, payload, signature = token.split(".")
    for path in tmp_path.iterdir():
        if path.name.startswith("sessions"):
            data = path.read_bytes()
            for part in (token, signature, payload):
                assert part.encode() not in data, path


async def test_sessions_metrics(make_config, backend):
    from homeserver.context import build_homeserver, create_session_store

    config = make_config({"metrics": {"enabled": True}})
    store = create_session_store(config)
    await store.start()
    hs = build_homeserver(config, backend, store)
    try:
        await hs.sessions.open("t1", "alice", "DUMMY", None, "127.0.0.1")
        await hs.sessions.open("t2", "alice", "PHONE", None, "127.0.0.1")
        session = await hs.sessions.store.get("alice", token_digest("t1"))
        await hs.devices.logout(session)
        await hs.devices.logout_all("alice")
        text, _ = hs.metrics.render(None)
        text = text.decode()
        assert "homeserver_sessions_opened_total 2.0" in text
        assert 'homeserver_sessions_ended_total{reason="logout"} 1.0' in text
        assert 'homeserver_sessions_ended_total{reason="logout_all"} 1.0' in text
    finally:
        hs.checker.close()
        await store.close()


async def test_no_token_text_reaches_a_log_line(fetch, login, caplog):
    import logging

    from homeserver.logs import JsonFormatter

    caplog.set_level(logging.DEBUG)
    token = (await login(device_id="PHONE"))["access_token"]
    assert_json(await fetch(f"{DEVICES}?access_token={token}"))
    assert_json(await fetch(f"{DEVICES}/PHONE", "PUT", token=token, json_body={"display_name": "P"}))
    assert_json(await fetch(f"{LOGOUT}?access_token={token}", "POST"))
    assert_error(await fetch(WHOAMI, token=token), 401, "M_UNKNOWN_TOKEN")
    everything = "\n".join(JsonFormatter().format(r) for r in caplog.records)
    assert "access_token=redacted" in everything
    for part in (token, token.split(".")[2]):
        assert part not in everything
