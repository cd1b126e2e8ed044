"""POST /refresh (Matrix v1.3+, refresh.yaml) for password logins that ask `refresh_token: true` and
for refresh tokens carried from Synapse: the one rotation rule of the grants
(homeserver.oauth.grants.Grants.refresh), errors as the spec says."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from backends.sessions.imported import ImportBatch
from backends.sessions.oauth import Grant
from backends.sessions.records import Session
from homeserver.oauth.common import grant_session_digest
from homeserver.sessions import token_digest
from tests.support.helpers import assert_error, assert_json, record
from tests.support.openapi import validate

LOGIN = "/_matrix/client/v3/login"
REFRESH = "/_matrix/client/v3/refresh"
WHOAMI = "/_matrix/client/v3/account/whoami"
LOGOUT = "/_matrix/client/v3/logout"


def body_for(user="alice", password="wonderland", **extra):
    return {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user}, "password": password,
            **extra}


async def refresh(fetch, token, path=REFRESH):
    return await fetch(path, "POST", json_body={"refresh_token": token})


async def test_a_login_asking_for_a_refresh_token_gets_one_on_a_device_of_its_own(fetch):
    resp = await fetch(LOGIN, "POST", json_body=body_for(refresh_token=True))
    body = assert_json(resp)
    validate(resp, "login.yaml", "/login", "POST")
    assert body["refresh_token"] and body["expires_in_ms"] == 300_000
    # A refresh token is one device's: never the DUMMY every other login shares.
    assert body["device_id"] != "DUMMY" and len(body["device_id"]) == 10
    whoami = assert_json(await fetch(WHOAMI, token=body["access_token"]))
    assert whoami["device_id"] == body["device_id"]
    plain = assert_json(await fetch(LOGIN, "POST", json_body=body_for(refresh_token=False)))
    assert set(plain) == {"user_id", "access_token", "home_server", "device_id"} and plain["device_id"] == "DUMMY"


async def test_refresh_rotates_and_keeps_the_device(fetch):
    login = assert_json(await fetch(LOGIN, "POST", json_body=body_for(refresh_token=True, device_id="MYPHONE")))
    resp = await refresh(fetch, login["refresh_token"])
    body = assert_json(resp)
    validate(resp, "refresh.yaml", "/refresh", "POST")
    assert set(body) == {"access_token", "refresh_token", "expires_in_ms"}
    assert body["refresh_token"] != login["refresh_token"] and body["expires_in_ms"] == 300_000
    assert assert_json(await fetch(WHOAMI, token=body["access_token"]))["device_id"] == "MYPHONE"
    # The r0 path (Synapse's too) is the same endpoint.
    assert_json(await refresh(fetch, body["refresh_token"], "/_matrix/client/r0/refresh"))


async def test_a_lost_answer_is_retried_but_a_replay_is_refused_and_ends_the_session(fetch):
    login = assert_json(await fetch(LOGIN, "POST", json_body=body_for(refresh_token=True)))
    first = assert_json(await refresh(fetch, login["refresh_token"]))
    # The answer was lost: the same refresh token again, before the new access token is used.
    again = assert_json(await refresh(fetch, login["refresh_token"]))
    assert_json(await fetch(WHOAMI, token=again["access_token"]))
    assert_error(await fetch(WHOAMI, token=first["access_token"]), 401, "M_UNKNOWN_TOKEN")
    # Now the first refresh token is a replay: refused, and the session ends.
    resp = await refresh(fetch, login["refresh_token"])
    error = assert_error(resp, 401, "M_UNKNOWN_TOKEN")
    validate(resp, "refresh.yaml", "/refresh", "POST")
    assert error["soft_logout"] is False
    assert_error(await fetch(WHOAMI, token=again["access_token"]), 401, "M_UNKNOWN_TOKEN")
    assert_error(await refresh(fetch, again["refresh_token"]), 401, "M_UNKNOWN_TOKEN")


async def test_logout_ends_the_refresh_token_too(fetch):
    login = assert_json(await fetch(LOGIN, "POST", json_body=body_for(refresh_token=True)))
    assert_json(await fetch(LOGOUT, "POST", token=login["access_token"]))
    assert_error(await refresh(fetch, login["refresh_token"]), 401, "M_UNKNOWN_TOKEN")


@pytest.mark.parametrize(
    "body, status, errcode",
    [
        ({"refresh_token": "mhr_unknown"}, 401, "M_UNKNOWN_TOKEN"),
        ({"refresh_token": "x" * 5000}, 401, "M_UNKNOWN_TOKEN"),
        ({}, 400, "M_MISSING_PARAM"),
        ({"refresh_token": 7}, 400, "M_INVALID_PARAM"),
        ([], 400, "M_BAD_JSON"),
    ],
)
async def test_bad_requests(fetch, body, status, errcode):
    resp = await fetch(REFRESH, "POST", json_body=body)
    answer = assert_error(resp, status, errcode)
    if status == 401:
        assert answer["soft_logout"] is False
        validate(resp, "refresh.yaml", "/refresh", "POST")
    assert_error(await fetch(REFRESH, "POST", body="{"), 400, "M_NOT_JSON")


async def test_a_login_with_a_refresh_token_that_is_no_boolean_is_refused(fetch):
    assert_error(await fetch(LOGIN, "POST", json_body=body_for(refresh_token="yes")), 400, "M_INVALID_PARAM")


async def test_a_changed_password_ends_what_the_refresh_token_opened(fetch, hs, users_path):
    login = assert_json(await fetch(LOGIN, "POST", json_body=body_for(refresh_token=True)))
    path = Path(users_path)
    users = json.loads(path.read_text())["users"]
    users[0]["password"] = record("alice", "new password")["password"]
    path.write_text(json.dumps({"users": users}))
    await hs.backend.reload()
    assert_error(await refresh(fetch, login["refresh_token"]), 401, "M_UNKNOWN_TOKEN")


async def plant_synapse_session(hs, *, access: str, refresh_token: str, previous: str = "", used: bool = False):
    """What a move makes of a refreshable Synapse session: the access token's session, the grant
    (client "legacy") with its own session, and the bookkeeping."""
    user = await hs.users.get("alice")
    fp = hs.credentials.of(user)
    now = int(time.time() * 1000)
    grant = Grant("synapse-7", "alice", "LAPTOP", "legacy", "", token_digest(refresh_token),
                  token_digest(previous) if previous else "", token_digest(access), now, now, access_used=used)
    sessions = [
        Session(token_digest(access), "alice", "LAPTOP", now, "", now, now + 60_000, None, fp.identity, fp.password),
        Session(grant_session_digest(grant.grant_id), "alice", "LAPTOP", now, "", now, None, None, fp.identity,
                fp.password),
    ]
    await hs.sessions.store.imported().add(ImportBatch(
        sessions=[(s, "Alice's laptop") for s in sessions], grants=[(grant, 86400.0)],
        tokens=[(token_digest(t), "alice") for t in (access, refresh_token, previous) if t]))


async def test_a_refresh_token_carried_from_synapse_refreshes_here(fetch, hs):
    await plant_synapse_session(hs, access="syt_YWxpY2U_access_x", refresh_token="syr_YWxpY2U_two_x",
                                previous="syr_YWxpY2U_one_x")
    # The superseded one still works while its successor's access token was not used (Synapse's rule too).
    first = assert_json(await refresh(fetch, "syr_YWxpY2U_one_x"))
    assert assert_json(await fetch(WHOAMI, token=first["access_token"]))["device_id"] == "LAPTOP"
    # Now the first is a replay, and the session ends.
    assert_error(await refresh(fetch, "syr_YWxpY2U_one_x"), 401, "M_UNKNOWN_TOKEN")
    assert_error(await fetch(WHOAMI, token=first["access_token"]), 401, "M_UNKNOWN_TOKEN")


async def test_a_superseded_synapse_refresh_token_whose_successor_was_used_is_a_replay(fetch, hs):
    await plant_synapse_session(hs, access="syt_a", refresh_token="syr_two", previous="syr_one", used=True)
    assert_error(await refresh(fetch, "syr_one"), 401, "M_UNKNOWN_TOKEN")
    assert_error(await refresh(fetch, "syr_two"), 401, "M_UNKNOWN_TOKEN")  # the session ended with the replay


@pytest.mark.parametrize("config_overrides", [{"auth": {"refreshable_token_lifetime": 60}}])
async def test_the_lifetime_is_configured(fetch, config_overrides):
    login = assert_json(await fetch(LOGIN, "POST", json_body=body_for(refresh_token=True)))
    assert login["expires_in_ms"] == 60_000
    assert assert_json(await refresh(fetch, login["refresh_token"]))["expires_in_ms"] == 60_000
