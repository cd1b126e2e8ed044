"""Delegation (`[delegation]`) against an in-process fake Synapse: config, introspection,
logins, every end of a session, the retry, the CLI. The real Synapse behind nginx, real
clients and E2EE are in the end-to-end tests; these cover the protocol's edges fast."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backends.sessions.base import Session
from homeserver.context import build_homeserver, create_session_store
from homeserver.delegation import load_delegation_settings
from homeserver.delegation.introspection import ADMIN_SCOPE
from homeserver.delegation.introspection import introspect as run_introspection
from homeserver.errors import ConfigError
from homeserver.sessions import token_digest
from tests.support.delegation_fakes import SECRET
from tests.support.helpers import DEFAULT_USERS, JWT_SECRET, assert_error, assert_json, record
from tests.support.openapi import validate
from tests.support.servers import ROOT

LOGIN = "/_matrix/client/v3/login"
LOGOUT = "/_matrix/client/v3/logout"
DEVICES = "/_matrix/client/v3/devices"
INTROSPECT = "/oauth2/introspect"
OPENID = "/.well-known/openid-configuration"
BEARER = {"Authorization": f"Bearer {SECRET}"}
FORM = {**BEARER, "Content-Type": "application/x-www-form-urlencoded"}
DEVICE_ID = re.compile(r"[A-Z]{10}")


def edit_users(path: str, change) -> None:
    file = Path(path)
    file.write_text(json.dumps({"users": change(json.loads(file.read_text())["users"])}))


def scope(device: str, admin: bool = False) -> str:
    parts = [
        "urn:matrix:client:api:*",
        "urn:matrix:org.matrix.msc2967.client:api:*",
        f"urn:matrix:client:device:{device}",
        f"urn:matrix:org.matrix.msc2967.client:device:{device}",
    ]
    return " ".join(parts + ([ADMIN_SCOPE] if admin else []))


@pytest.fixture
def delegated() -> bool:
    return True


@pytest.fixture
def delegation_section(synapse) -> dict:
    return synapse.section(admins=["bob"], retry_interval=0.1)


@pytest.fixture
def config_overrides(delegated, delegation_section):
    return {"delegation": delegation_section} if delegated else {}


async def introspect(fetch, token: str, headers: dict | None = None, **form) -> tuple[int, dict]:
    body = "&".join([f"token={token}", "token_type_hint=access_token", *(f"{k}={v}" for k, v in form.items())])
    resp = await fetch(INTROSPECT, "POST", body=body, headers=FORM if headers is None else headers)
    return resp.status, resp.json


# -- config -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "section, message",
    [
        ({"secret": "short"}, "delegation.secret: must be at least 32 bytes"),
        ({"secret": ""}, "delegation.secret: needed when delegation.enabled is true (or delegation.secret_file)"),
        ({"secret_file": "s.txt"}, "delegation.secret and delegation.secret_file: give one of them, not both"),
        ({"synapse_url": ""}, "delegation.synapse_url: needed when delegation.enabled is true (Synapse's client listener)"),
    ],
)
def test_config_errors_are_one_line(make_config, delegation_section, section, message):
    config = make_config({"delegation": {**delegation_section, **section}})
    with pytest.raises(ConfigError) as info:
        load_delegation_settings(config)
    assert str(info.value) == message


@pytest.mark.parametrize("secret", ["geheimnis-\u20ac-0123456789abcdefghijkl", "geheimnis-\u00e9-0123456789abcdefghijkl",
                                    "two words 0123456789abcdefghijklmnop"])
def test_a_secret_synapse_cannot_read_is_refused_unsaid(make_config, delegation_section, tmp_path, secret):
    # It travels in an Authorization header, which Synapse splits at spaces and reads as ASCII;
    # one past Latin-1 failed at every call with the header line, the secret in it, in the log.
    message = "delegation.secret: only visible ASCII characters, no spaces (Synapse reads it from an HTTP header)"
    with pytest.raises(ConfigError) as info:
        load_delegation_settings(make_config({"delegation": {**delegation_section, "secret": secret}}))
    assert str(info.value) == message
    (tmp_path / "s.txt").write_text(secret + "\n")
    with pytest.raises(ConfigError) as info:
        load_delegation_settings(make_config({"delegation": {**delegation_section, "secret": "", "secret_file": "s.txt"}}))
    assert str(info.value) == message.replace("delegation.secret:", f"delegation.secret_file: {tmp_path / 's.txt'}:")


def test_config_secret_file(make_config, delegation_section, tmp_path):
    (tmp_path / "short.txt").write_text("tiny\n")
    (tmp_path / "good.txt").write_text(SECRET + "\n")
    base = {**delegation_section, "secret": ""}
    with pytest.raises(ConfigError, match=r"^delegation.secret_file: .*short.txt holds fewer than 32 bytes$"):
        load_delegation_settings(make_config({"delegation": {**base, "secret_file": "short.txt"}}))
    with pytest.raises(ConfigError, match=r"^delegation.secret_file: .*missing.txt cannot be read"):
        load_delegation_settings(make_config({"delegation": {**base, "secret_file": "missing.txt"}}))
    settings = load_delegation_settings(make_config({"delegation": {**base, "secret_file": "good.txt"}}))
    assert settings is not None and settings.secret == SECRET
    assert load_delegation_settings(make_config({})) is None


def test_config_from_the_environment(make_config, synapse):
    environ = {
        "HOMESERVER_DELEGATION__ENABLED": "true",
        "HOMESERVER_DELEGATION__SYNAPSE_URL": synapse.url,
        "HOMESERVER_DELEGATION__SECRET": SECRET,
        "HOMESERVER_DELEGATION__ADMINS": '["alice"]',
    }
    settings = load_delegation_settings(make_config(environ=environ))
    assert settings is not None and settings.admins == frozenset({"alice"}) and settings.secret == SECRET


def test_a_short_secret_stops_start_up_with_one_line(tmp_path):
    (tmp_path / "users.json").write_text(json.dumps({"users": []}))
    config = tmp_path / "hs.toml"
    config.write_text(
        f'[server]\nport = 0\n[auth]\njwt_secret = "{JWT_SECRET}"\n[backend.file]\npath = "users.json"\n'
        '[delegation]\nenabled = true\nsynapse_url = "http://127.0.0.1:9"\nsecret = "too-short"\n'
    )
    done = subprocess.run(
        [sys.executable, "run.py", "--config", str(config)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert done.stderr == "homeserver: error: delegation.secret: must be at least 32 bytes\n"


# -- what Synapse calls ---------------------------------------------------------------------------


async def test_openid_configuration(fetch, config):
    body = assert_json(await fetch(OPENID))
    base = config.get("server", "base_url").rstrip("/")
    assert body == {
        "issuer": base + "/",
        "account_management_uri": base + "/account/",
        "introspection_endpoint": base + "/oauth2/introspect",
    }


@pytest.mark.parametrize("delegated", [False])
async def test_without_delegation_there_is_no_openid_configuration_nor_introspection(fetch, login, delegated):
    assert_error(await fetch(OPENID), 404, "M_UNRECOGNIZED")
    token = (await login())["access_token"]
    assert_error(await fetch(INTROSPECT, "POST", body=f"token={token}", headers=FORM), 404, "M_UNRECOGNIZED")
    # DUMMY stays, as the specification says.
    assert (await login())["device_id"] == "DUMMY"


@pytest.mark.parametrize("delegated", [True, False])
@pytest.mark.parametrize(
    "path", ["/_matrix/client/v1/auth_metadata", "/_matrix/client/unstable/org.matrix.msc2965/auth_metadata"]
)
async def test_auth_metadata_is_unrecognized_so_clients_use_password_login(fetch, path, delegated):
    assert_error(await fetch(path), 404, "M_UNRECOGNIZED")
    flows = assert_json(await fetch(LOGIN))
    assert flows == {"flows": [{"type": "m.login.password"}]}


async def test_introspection_of_a_good_token(fetch, login, synapse):
    login_body = await login(initial_device_display_name="Phone")
    device = login_body["device_id"]
    status, body = await introspect(fetch, login_body["access_token"])
    assert status == 200
    assert body == {
        "active": True,
        "username": "alice",
        "sub": "alice",
        "device_id": device,
        "token_type": "access_token",
        "scope": scope(device),
    }


async def test_introspection_gives_admins_the_synapse_admin_scope(fetch, login):
    login_body = await login("bob", "builder")
    status, body = await introspect(fetch, login_body["access_token"])
    assert status == 200 and body["scope"] == scope(login_body["device_id"], admin=True)


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": SECRET}, {"Authorization": f"Basic {SECRET}"}])
async def test_introspection_needs_the_secret(fetch, login, headers):
    token = (await login())["access_token"]
    resp = await fetch(INTROSPECT, "POST", body=f"token={token}", headers=headers)
    assert resp.status == 401, resp
    assert "active" not in resp.json


async def test_introspection_of_bad_tokens_is_inactive(fetch, login, hs, tmp_path, users_path):
    good = (await login())["access_token"]
    header, claims, signature = good.split(".")
    ended = (await login())["access_token"]
    assert (await fetch(LOGOUT, "POST", token=ended)).status == 200
    bob = (await login("bob", "builder"))["access_token"]
    forged = hs.tokens.__class__("another-secret-that-is-at-least-32-bytes-long").issue("alice", "ABCDEFGHIJ")
    never_stored = hs.tokens.issue("alice", "ABCDEFGHIJ")
    for token in ["", "garbage", "a.b.c", f"{header}.{claims}.{signature[:-2]}xx", ended, forged, never_stored, "%FF%FE", "x" * 5000]:
        status, body = await introspect(fetch, token)
        if token == "":
            assert status == 400, token
            continue
        assert (status, body) == (200, {"active": False}), token
    # A user removed from the user store: inactive at once.
    edit_users(users_path, lambda users: [u for u in users if u["name"] != "bob"])
    await hs.backend.reload()
    assert await introspect(fetch, bob) == (200, {"active": False})
    assert (await introspect(fetch, good))[1]["active"] is True


async def test_introspection_of_an_expiring_token_says_when(make_config, delegation_section, backend, session_store, io_loop):
    config = make_config({"delegation": delegation_section, "auth": {"jwt_secret": JWT_SECRET, "token_lifetime": 3600}})
    hs = build_homeserver(config, backend, session_store)
    try:
        body = await hs.login.login(json.dumps({"type": "m.login.password", "user": "alice", "password": "wonderland"}).encode(), "127.0.0.1")
        answer = await run_introspection(hs.auth, body["access_token"], frozenset())
        assert 3590 <= answer["expires_in"] <= 3600
        assert answer["active"] is True
    finally:
        await hs.delegation.close()
        hs.checker.close()


@pytest.mark.parametrize(
    "body, status",
    [
        (b"token_type_hint=access_token", 400),  # no token
        (b"token=a&token=b", 400),  # two
        (b"&".join(b"f%d=1" % i for i in range(40)), 400),  # too many fields
        (b"token=\xff\xfe", 200),  # not UTF-8: no token of ours
        (b"\x00\x01\x02", 400),
        (b'{"token": "x"}', 400),  # JSON is not the form
    ],
)
async def test_introspection_of_garbage_is_never_a_5xx(fetch, body, status):
    resp = await fetch(INTROSPECT, "POST", body=body, headers=FORM)
    assert resp.status == status, resp
    if status == 200:
        assert resp.json == {"active": False}


async def test_introspection_body_is_bounded(fetch):
    resp = await fetch(INTROSPECT, "POST", body=b"token=" + b"x" * 200_000, headers=FORM)
    assert_error(resp, 413, "M_TOO_LARGE")


async def test_introspection_of_a_refresh_token_hint_is_inactive(fetch, login):
    token = (await login())["access_token"]
    resp = await fetch(INTROSPECT, "POST", body=f"token={token}&token_type_hint=refresh_token", headers=FORM)
    assert (resp.status, resp.json) == (200, {"active": False})


async def test_introspection_when_the_session_store_cannot_answer_is_not_inactive(fetch, login, session_store):
    token = (await login())["access_token"]
    await session_store.close()  # every read now fails: StoreUnavailable
    resp = await fetch(INTROSPECT, "POST", body=f"token={token}", headers=FORM)
    assert resp.status == 503, resp
    await session_store.start()


async def test_introspection_does_not_move_last_seen_to_synapse(fetch, login, session_store):
    body = await login()
    session_store_before = await session_store.device("alice", body["device_id"])
    await introspect(fetch, body["access_token"], headers={**FORM, "X-Forwarded-For": "10.9.9.9"})
    await asyncio.sleep(0.05)
    after = await session_store.device("alice", body["device_id"])
    assert after.last_seen_ip == session_store_before.last_seen_ip == "127.0.0.1"


# -- logins ---------------------------------------------------------------------------------------


async def test_each_login_gets_its_own_device_and_synapse_has_it_first(fetch, login, synapse):
    first = await login(initial_device_display_name="Alice's phone")
    second = await login()
    assert DEVICE_ID.fullmatch(first["device_id"]) and DEVICE_ID.fullmatch(second["device_id"])
    assert first["device_id"] != second["device_id"]
    # Synapse's server_name is read once per process, on the first login; a later login
    # reads Synapse's profile of the user (to put back one changed there).
    assert synapse.names() == ["provision_user", "upsert_device", "query_user", "query_user", "upsert_device"]
    assert synapse.calls[0][1] == {
        "localpart": "alice",
        "set_displayname": "Alice [alice]",
        "set_avatar_url": "mxc://localhost/alice",
        "unset_emails": True,
        "locked": False,
    }
    assert synapse.calls[1][1] == {"localpart": "alice", "device_id": first["device_id"], "display_name": "Alice's phone"}
    assert synapse.calls[4][1] == {"localpart": "alice", "device_id": second["device_id"]}
    assert synapse.devices["alice"] == {first["device_id"]: "Alice's phone", second["device_id"]: None}


async def test_login_response_is_v1_12(fetch, synapse):
    body = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": "alice"}, "password": "wonderland"}
    resp = await fetch(LOGIN, "POST", json_body=body)
    validate(resp, "login.yaml", "/login", "POST")


async def test_provisioned_again_only_when_the_profile_changed(login, synapse, hs, users_path):
    await login()
    await login()
    assert synapse.names().count("provision_user") == 1
    edit_users(users_path, lambda users: [{**users[0], "display_name": "Alice Liddell", "email": "Alice@Example.org"}, *users[1:]])
    await hs.backend.reload()
    await login()
    provisions = [body for name, body in synapse.calls if name == "provision_user"]
    assert provisions[-1] == {
        "localpart": "alice",
        "set_displayname": "Alice Liddell [alice]",
        "set_avatar_url": "mxc://localhost/alice",
        "set_emails": ["alice@example.org"],
        "locked": False,
    }
    await login()
    assert synapse.names().count("provision_user") == 2


async def test_a_user_synapse_lost_is_provisioned_again(login, synapse):
    await login()
    synapse.users.clear()
    synapse.devices.clear()
    body = await login()
    # The login reads Synapse's profile, finds no user, and provisions before the device.
    assert synapse.names()[-3:] == ["query_user", "provision_user", "upsert_device"]
    assert body["device_id"] in synapse.devices["alice"]


async def test_naming_a_device_ends_its_earlier_session_and_keeps_the_device(fetch, login, synapse):
    first = await login(device_id="PHONE", initial_device_display_name="Phone")
    other = await login()
    again = await login(device_id="PHONE")
    assert again["device_id"] == "PHONE"
    assert await introspect(fetch, first["access_token"]) == (200, {"active": False})
    assert_error(await fetch("/_matrix/client/v3/account/whoami", token=first["access_token"]), 401, "M_UNKNOWN_TOKEN")
    assert (await introspect(fetch, again["access_token"]))[1]["active"] is True
    assert (await introspect(fetch, other["access_token"]))[1]["active"] is True
    # The device (and its keys) stay at Synapse: no deletion, an upsert.
    assert "delete_device" not in synapse.names() and "sync_devices" not in synapse.names()
    assert synapse.devices["alice"]["PHONE"] == "Phone"
    devices = assert_json(await fetch(DEVICES, token=again["access_token"]))["devices"]
    assert sorted(d["device_id"] for d in devices) == sorted(["PHONE", other["device_id"]])


async def test_a_device_id_synapse_would_refuse_is_a_400(fetch, synapse):
    body = {"type": "m.login.password", "user": "alice", "password": "wonderland", "device_id": "D" * 256}
    assert_error(await fetch(LOGIN, "POST", json_body=body), 400, "M_INVALID_PARAM")
    assert synapse.calls == []


@pytest.mark.parametrize("mode", ["down", "error", "hang", "garbage", "huge", "wrong_secret", "no_api"])
async def test_login_when_synapse_cannot_take_it_is_503_and_leaves_nothing(fetch, synapse, session_store, mode, caplog):
    if mode == "down":
        await synapse.stop()
    else:
        synapse.mode = mode
    body = {"type": "m.login.password", "user": "alice", "password": "wonderland", "device_id": "PHONE"}
    with caplog.at_level(logging.WARNING):
        resp = await fetch(LOGIN, "POST", json_body=body)
    assert_error(resp, 503, "M_UNKNOWN")
    assert resp.headers["Retry-After"] == "5"
    assert await session_store.devices("alice") == []
    assert await session_store.users() == []
    # A device the upsert may have left at Synapse is taken back once it answers.
    assert set(await session_store.delegation().resyncs()) == {"alice"}
    if mode == "wrong_secret":
        assert "refuses our secret" in caplog.text and "matrix_authentication_service.secret" in caplog.text
    if mode == "no_api":
        assert "has no /_synapse/mas/ API" in caplog.text


async def test_a_failed_login_on_a_named_device_keeps_its_earlier_session(fetch, login, synapse):
    first = await login(device_id="PHONE")
    synapse.mode = "error"
    body = {"type": "m.login.password", "user": "alice", "password": "wonderland", "device_id": "PHONE"}
    assert_error(await fetch(LOGIN, "POST", json_body=body), 503, "M_UNKNOWN")
    assert (await introspect(fetch, first["access_token"]))[1]["active"] is True


@pytest.mark.parametrize("user_records", [[record("Carol", "secret", "-c")]])
async def test_a_name_synapse_refuses_is_said_plainly(fetch, synapse, caplog, user_records):
    body = {"type": "m.login.password", "user": "Carol", "password": "secret"}
    with caplog.at_level(logging.WARNING):
        assert_error(await fetch(LOGIN, "POST", json_body=body), 503, "M_UNKNOWN")
    assert "Synapse refuses the user name 'Carol' (provision_user: 400 M_INVALID_USERNAME" in caplog.text
    assert "backend.ldap.lowercase_user_ids" in caplog.text


async def test_a_wrong_password_calls_nothing(fetch, synapse):
    body = {"type": "m.login.password", "user": "alice", "password": "nope"}
    assert_error(await fetch(LOGIN, "POST", json_body=body), 403, "M_FORBIDDEN")
    assert synapse.calls == []


async def test_server_name_mismatch_is_said_in_one_line(login, synapse, caplog):
    synapse.server_name = "other.example"
    with caplog.at_level(logging.ERROR):
        await login()
        await login("bob", "builder")
    lines = [r.getMessage() for r in caplog.records if "server_name" in r.getMessage()]
    assert lines == [
        "delegation: Synapse's server_name is 'other.example' but server.server_name here is 'localhost': "
        "user IDs differ between the two; make them equal"
    ]


# -- every end of a session reaches Synapse ---------------------------------------------------------


async def test_logout_deletes_the_device_at_synapse(fetch, login, synapse):
    body = await login()
    keep = await login()
    resp = await fetch(LOGOUT, "POST", token=body["access_token"])
    assert assert_json(resp) == {}
    validate(resp, "logout.yaml", "/logout", "POST")
    # Every end reaches Synapse one way: the devices still open here, synced (as MAS's SyncDevicesJob).
    assert synapse.calls[-1] == ("sync_devices", {"localpart": "alice", "devices": [keep["device_id"]]})
    assert "delete_device" not in synapse.names()
    assert list(synapse.devices["alice"]) == [keep["device_id"]]


async def test_logout_all_syncs_no_devices(fetch, login, synapse):
    body = await login()
    await login()
    assert (await fetch(LOGOUT + "/all", "POST", token=body["access_token"])).status == 200
    assert synapse.calls[-1] == ("sync_devices", {"localpart": "alice", "devices": []})
    assert synapse.devices["alice"] == {}


async def test_device_deletion_reaches_synapse(fetch, login, synapse):
    main = await login()
    one, two, three = (await login())["device_id"], (await login())["device_id"], (await login())["device_id"]
    auth = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": "alice"}, "password": "wonderland"}
    resp = await fetch(f"{DEVICES}/{one}", "DELETE", token=main["access_token"], json_body={"auth": auth})
    assert resp.status == 200, resp
    assert synapse.calls[-1] == ("sync_devices", {"localpart": "alice", "devices": sorted([main["device_id"], two, three])})
    resp = await fetch(
        "/_matrix/client/v3/delete_devices", "POST", token=main["access_token"], json_body={"devices": [two, three], "auth": auth}
    )
    assert resp.status == 200, resp
    assert synapse.calls[-1] == ("sync_devices", {"localpart": "alice", "devices": [main["device_id"]]})
    assert list(synapse.devices["alice"]) == [main["device_id"]]


async def test_rename_reaches_synapse_first(fetch, login, synapse):
    body = await login()
    device = body["device_id"]
    resp = await fetch(f"{DEVICES}/{device}", "PUT", token=body["access_token"], json_body={"display_name": "Laptop"})
    assert resp.status == 200, resp
    assert synapse.calls[-1] == (
        "update_device_display_name",
        {"localpart": "alice", "device_id": device, "display_name": "Laptop"},
    )
    synapse.mode = "error"
    resp = await fetch(f"{DEVICES}/{device}", "PUT", token=body["access_token"], json_body={"display_name": "Desk"})
    assert_error(resp, 503, "M_UNKNOWN")
    synapse.mode = "ok"
    assert assert_json(await fetch(f"{DEVICES}/{device}", token=body["access_token"]))["display_name"] == "Laptop"


async def test_revoke_and_the_sweep_reach_synapse(login, synapse, hs, users_path):
    one = await login()
    two = await login()
    await hs.devices.revoke("alice", [one["device_id"]])
    assert synapse.calls[-1] == ("sync_devices", {"localpart": "alice", "devices": [two["device_id"]]})
    await hs.devices.revoke("alice", None)
    assert synapse.calls[-1] == ("sync_devices", {"localpart": "alice", "devices": []})
    await login("bob", "builder")
    edit_users(users_path, lambda users: [u for u in users if u["name"] != "bob"])
    await hs.backend.reload()
    await hs.devices.sweep_removed_users(hs.users)
    await hs.devices.sweep_removed_users(hs.users)
    assert synapse.calls[-1] == ("sync_devices", {"localpart": "bob", "devices": []})
    assert synapse.devices["bob"] == {}


@pytest.mark.parametrize("mode", ["down", "error", "hang"])
async def test_logout_while_synapse_is_away_ends_here_and_lands_later(fetch, login, synapse, hs, session_store, mode):
    body = await login()
    keep = await login()
    if mode == "down":
        await synapse.stop()
    else:
        synapse.mode = mode
    assert (await fetch(LOGOUT, "POST", token=body["access_token"])).status == 200
    assert await introspect(fetch, body["access_token"]) == (200, {"active": False})
    assert set(await session_store.delegation().resyncs()) == {"alice"}
    assert await hs.delegation.resync_pending() == (0, 1)  # still away: kept
    if mode == "down":
        synapse.start()
    synapse.mode = "ok"
    assert await hs.delegation.resync_pending() == (1, 0)
    assert synapse.calls[-1] == ("sync_devices", {"localpart": "alice", "devices": [keep["device_id"]]})
    assert list(synapse.devices["alice"]) == [keep["device_id"]]
    assert await session_store.delegation().resyncs() == {}


async def test_a_missed_sign_out_survives_a_restart(fetch, login, synapse, config, backend, session_store, io_loop):
    body = await login()
    await synapse.stop()
    assert (await fetch(LOGOUT + "/all", "POST", token=body["access_token"])).status == 200
    await session_store.close()
    # A new server on the same session store, Synapse back: the background loop lands it.
    synapse.start()
    store = create_session_store(config)
    await store.start()
    hs = build_homeserver(config, backend, store)
    try:
        assert set(await store.delegation().resyncs()) == {"alice"}
        hs.delegation.start()
        deadline = time.monotonic() + 10
        while await store.delegation().resyncs() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert await store.delegation().resyncs() == {}
        assert synapse.calls[-1] == ("sync_devices", {"localpart": "alice", "devices": []})
        assert synapse.devices["alice"] == {}
    finally:
        await hs.delegation.close()
        hs.checker.close()
        await store.close()
        await session_store.start()


async def test_cross_signing_reset_and_query_user(login, synapse, hs):
    await login()
    await hs.delegation.allow_cross_signing_reset("alice")
    assert synapse.calls[-1] == ("allow_cross_signing_reset", {"localpart": "alice"})
    assert (await hs.delegation.query_user("alice"))["user_id"] == "@alice:localhost"


# -- start-up -------------------------------------------------------------------------------------


async def test_probe_says_plainly_what_is_wrong(hs, synapse, caplog):
    with caplog.at_level(logging.INFO):
        synapse.mode = "wrong_secret"
        assert not await hs.delegation.probe()
        assert not await hs.delegation.probe()  # said once, not at every attempt
        synapse.mode = "ok"
        assert await hs.delegation.probe()
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("homeserver.delegation")]
    assert messages == [
        f"delegation: Synapse at {synapse.url} refuses our secret (query_user: 403 M_UNKNOWN This endpoint must only "
        "be called by MAS): delegation.secret must equal its matrix_authentication_service.secret",
        f"delegation: Synapse at {synapse.url} answers again",
        f"delegation: Synapse at {synapse.url} answers and takes our secret",
    ]


async def test_start_up_with_synapse_not_there_yet_warns_and_retries(hs, synapse, caplog):
    await synapse.stop()
    with caplog.at_level(logging.INFO):
        hs.delegation.start()
        await asyncio.sleep(0.5)
        assert "cannot be reached" in caplog.text
        synapse.start()
        deadline = time.monotonic() + 10
        while "answers and takes our secret" not in caplog.text and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    assert "answers and takes our secret" in caplog.text
    assert caplog.text.count("cannot be reached") == 1


# -- the command line -------------------------------------------------------------------------------


async def run_py(tmp_path, synapse, users_path, *args: str, extra: str = "") -> tuple[int, str, str]:
    """`run.py` on the tests' session store (tmp_path), without blocking the loop the fake Synapse
    runs on; `extra`: more `[delegation]` keys."""
    config = tmp_path / "homeserver.toml"
    config.write_text(
        f'[auth]\njwt_secret = "{JWT_SECRET}"\n[backend.file]\npath = "{users_path}"\n'
        f'[delegation]\nenabled = true\nsynapse_url = "{synapse.url}"\nsecret = "{SECRET}"\ntimeout = 1.0\n{extra}'
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "run.py", "--config", str(config), *args,
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_cli_revoke_reaches_synapse(tmp_path, synapse, login, session_store, users_path):
    phone = (await login(device_id="PHONE"))["device_id"]
    await login(device_id="DESK")
    code, out, err = await run_py(tmp_path, synapse, users_path, "sessions", "revoke", "alice", "--device", phone)
    assert (code, out) == (0, "Ended 1 session of device PHONE of @alice:localhost.\n")
    # Not at a terminal, standard error holds the revocation's audit line, nothing else.
    assert err.count("\n") == 1 and 'audit revoke user="alice" device="PHONE" client="cli"' in err, err
    assert synapse.calls[-1] == ("sync_devices", {"localpart": "alice", "devices": ["DESK"]})
    await synapse.stop()
    code, out, err = await run_py(tmp_path, synapse, users_path, "sessions", "revoke", "alice", "--all")
    assert code == 0, err
    assert out.splitlines() == [
        "Ended 1 session of @alice:localhost.",
        "Synapse could not be told yet: the running server tells it as soon as it answers.",
    ]
    assert set(await session_store.delegation().resyncs()) == {"alice"}


async def test_cli_delegation_sync(tmp_path, synapse, login, session_store, users_path):
    a = await login(device_id="PHONE")
    await login("bob", "builder", device_id="DESK")
    synapse.users.clear()
    synapse.devices.clear()
    code, out, err = await run_py(tmp_path, synapse, users_path, "delegation", "sync")
    assert code == 0, err
    assert out.splitlines() == [
        "@alice:localhost: created at Synapse; devices with a session here: PHONE",
        "@bob:localhost: created at Synapse; devices with a session here: DESK",
        "Synapse has the users and devices of the sessions here: 2 users (2 created).",
    ]
    assert synapse.devices["alice"] == {"PHONE": None} and synapse.devices["bob"] == {"DESK": None}
    assert a["device_id"] == "PHONE"
    # Again: alice unchanged, bob renamed at Synapse (put back); a user with only a pending
    # resync is synced too.
    await session_store.delegation().mark_resync("carol", 1)
    synapse.users["bob"]["displayname"] = "Bobby"
    code, out, err = await run_py(tmp_path, synapse, users_path, "delegation", "sync")
    assert code == 0, err
    assert out.splitlines() == [
        "@alice:localhost: unchanged at Synapse; devices with a session here: PHONE",
        "@bob:localhost: updated at Synapse; devices with a session here: DESK",
        "@carol:localhost: not in the user store; devices with a session here: none",
        "Synapse has the users and devices of the sessions here: 3 users (1 updated, 1 unchanged, "
        "1 not in the user store).",
    ]
    assert synapse.users["bob"]["displayname"] == "bob-ident"
    assert await session_store.delegation().resyncs() == {}
    # Synapse away: one line, exit 1.
    await synapse.stop()
    code, out, err = await run_py(tmp_path, synapse, users_path, "delegation", "sync")
    assert code == 1 and err.startswith("homeserver: error: Synapse did not take it: query_user: ") and err.count("\n") == 1, err


@pytest.mark.parametrize("user_records", [[*map(dict, DEFAULT_USERS), record("Carol", "secret", "-c")]])
async def test_cli_delegation_sync_goes_on_past_a_user_synapse_refuses(tmp_path, synapse, login, fetch, session_store,
                                                                     users_path, user_records):
    await login(device_id="PHONE")
    await login("bob", "builder", device_id="DESK")
    body = {"type": "m.login.password", "user": "Carol", "password": "secret"}
    assert_error(await fetch(LOGIN, "POST", json_body=body), 503, "M_UNKNOWN")  # marked for a resync
    synapse.users.clear()
    synapse.devices.clear()
    code, out, err = await run_py(tmp_path, synapse, users_path, "delegation", "sync")
    # "Carol" sorts first: the others are synced all the same, the refusal said on its line.
    assert out.splitlines() == [
        "@Carol:localhost: refused by Synapse: provision_user: 400 M_INVALID_USERNAME User ID may not contain "
        "upper-case letters",
        "@alice:localhost: created at Synapse; devices with a session here: PHONE",
        "@bob:localhost: created at Synapse; devices with a session here: DESK",
        "Synapse has the users and devices of the sessions here: 3 users (2 created, 1 refused).",
    ]
    assert (code, err) == (1, "homeserver: error: Synapse refused 1 user (said above)\n")
    assert synapse.devices == {"alice": {"PHONE": None}, "bob": {"DESK": None}}
    assert set(await session_store.delegation().resyncs()) == {"Carol"}  # not done: kept


def test_a_server_starts_before_synapse_and_says_so(start):
    server = start(
        _extra=f'[delegation]\nenabled = true\nsynapse_url = "http://127.0.0.1:9"\nsecret = "{SECRET}"\nretry_interval = 0.2\n'
    )
    server.wait_log("delegation: Synapse at http://127.0.0.1:9 cannot be reached (query_user: ")
    assert server.request("/_matrix/client/versions")[0] == 200
    assert server.request(OPENID)[0] == 200
    status, body = server.request("/_matrix/client/v3/login", {"type": "m.login.password", "user": "alice", "password": "wonderland"})
    assert (status, body["errcode"]) == (503, "M_UNKNOWN")
    assert server.proc.poll() is None
    assert server.log.read_text().count("delegation: Synapse at http://127.0.0.1:9 cannot be reached") == 1


async def test_resync_refused_is_said_once_and_kept(login, synapse, hs, session_store, caplog):
    await login()
    await session_store.delegation().mark_resync("alice", 7)
    synapse.modes["sync_devices"] = "wrong_secret"
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert await hs.delegation.resync_pending() == (0, 1)
    assert caplog.text.count("refuses our secret") == 1
    synapse.modes.clear()
    assert await hs.delegation.resync_pending() == (1, 0)
    assert await session_store.delegation().resyncs() == {}


@pytest.mark.parametrize(
    ("mode", "localpart", "refusal"),
    [
        ("wrong_secret", "alice", "SynapseMisconfigured"),
        ("no_api", "alice", "SynapseMisconfigured"),
        ("ok", "Carol", "SynapseBadName"),
        ("error", "alice", "SynapseUnreachable"),
        ("garbage", "alice", "SynapseUnreachable"),
    ],
)
async def test_synapse_refusals_are_classified_once_as_types(synapse, mode, localpart, refusal):
    """The client says what a refusal is by its type (callers test no status or errcode)."""
    from homeserver import delegation

    client = delegation.SynapseClient(synapse.url, SECRET, timeout=2.0)
    synapse.mode = mode
    try:
        with pytest.raises(delegation.SynapseError) as caught:
            await client.provision_user(localpart, display_name=None, avatar_url=None, emails=[])
        assert type(caught.value) is getattr(delegation, refusal)
        assert isinstance(caught.value, delegation.SynapseRefused) == (refusal not in ("SynapseUnreachable",))
        synapse.mode = "ok"
        with pytest.raises(delegation.SynapseNotFound):
            await client.query_user("nobody")
    finally:
        client.close()


@pytest.mark.parametrize("mode", ["no_api", "wrong_secret"])
async def test_a_resync_round_stops_at_a_misconfigured_synapse(login, synapse, hs, session_store, monkeypatch, mode):
    """Every marked user would fail alike: the round asks Synapse once, then waits."""
    await login()
    await login("bob", "builder")
    await session_store.delegation().mark_resync("alice", 7)
    await session_store.delegation().mark_resync("bob", 7)
    asked: list[str] = []
    sync = hs.delegation.client.sync_devices

    async def counted(localpart: str, device_ids: list[str]) -> None:
        asked.append(localpart)
        await sync(localpart, device_ids)

    monkeypatch.setattr(hs.delegation.client, "sync_devices", counted)
    synapse.mode = mode
    assert await hs.delegation.resync_pending() == (0, 2)
    assert asked == ["alice"]
    synapse.mode = "ok"
    assert await hs.delegation.resync_pending() == (2, 0)
    assert asked == ["alice", "alice", "bob"]


@pytest.fixture
def metrics_on(config_overrides):
    return {**config_overrides, "metrics": {"enabled": True}}


async def test_synapse_calls_are_counted(make_config, metrics_on, backend, session_store, synapse):
    hs = build_homeserver(make_config(metrics_on), backend, session_store)
    try:
        body = await hs.login.login(json.dumps({"type": "m.login.password", "user": "alice", "password": "wonderland"}).encode(), "127.0.0.1")
        await synapse.stop()
        session = await session_store.get("alice", token_digest(body["access_token"]))
        await hs.devices.logout(session)
        await hs.delegation.resync_pending()
        text, _ = hs.metrics.render("text/plain")
        lines = text.decode()
        assert 'homeserver_synapse_calls_total{call="upsert_device",outcome="ok"} 1.0' in lines
        assert 'homeserver_synapse_calls_total{call="provision_user",outcome="ok"} 1.0' in lines
        # The logout's sync, then the resync's: both unreachable.
        assert 'homeserver_synapse_calls_total{call="sync_devices",outcome="unreachable"} 2.0' in lines
        assert 'call="delete_device"' not in lines
        assert "homeserver_delegation_resyncs_pending 1.0" in lines
        assert 'homeserver_synapse_call_duration_seconds_count{call="upsert_device"} 1.0' in lines
    finally:
        await hs.delegation.close()
        hs.checker.close()


async def test_a_login_racing_a_sync_in_another_process_keeps_its_device(login, synapse, hs, session_store):
    first = await login()
    real_sync = hs.delegation.client.sync_devices

    async def sync_while_another_process_logs_in(localpart, devices):
        # Another worker's login: its device at Synapse, then its session here, while our
        # sync (which read the devices before) is on its way.
        await hs.delegation.client.upsert_device("alice", "RACER", None)
        await session_store.open(Session("racer-digest", "alice", "RACER", 1, "127.0.0.1", 1), None)
        await real_sync(localpart, devices)

    hs.delegation.client.sync_devices = sync_while_another_process_logs_in
    assert await hs.delegation.sync_devices("alice")
    assert synapse.calls[-2] == ("sync_devices", {"localpart": "alice", "devices": [first["device_id"]]})
    assert synapse.calls[-1] == ("upsert_device", {"localpart": "alice", "device_id": "RACER"})
    assert set(synapse.devices["alice"]) == {first["device_id"], "RACER"}
