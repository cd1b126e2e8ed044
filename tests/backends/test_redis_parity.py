"""The Redis and file backends answer alike through the HTTP app."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from tests.support.helpers import DEFAULT_USERS, assert_error, assert_json, record
from tests.support.redis_servers import redis_overrides

LOGIN = "/_matrix/client/v3/login"
PROFILE = "/_matrix/client/v3/profile/"
WHOAMI = "/_matrix/client/v3/account/whoami"
CAPABILITIES = "/_matrix/client/v3/capabilities"

USERS = [
    *DEFAULT_USERS,
    {**record("badhex"), "password": "zz-not-hex"},
    {**record("notbcrypt"), "password": b"plain text".hex()},
]


def login_body(user: str, password: str) -> dict:
    return {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user}, "password": password}


@pytest.fixture
def user_records():
    return [dict(r) for r in USERS]


@pytest.fixture(params=["file", "redis"])
def config_overrides(request):
    """Every test here runs on the file backend and on Redis: they must answer alike."""
    if request.param == "file":
        # Load the records with unusable passwords (by default a start-up error), so the
        # file backend answers their logins as Redis does.
        return {"backend.file": {"check_passwords": False}}
    return redis_overrides(request.getfixturevalue("redis_users"))


@pytest.fixture(autouse=True)
def _app(app):
    """Put `app`, and so the backend parameter above, in every test's fixture closure.

    pytest-tornasync's server looks `app` up by name at run time, out of pytest's sight.
    """



async def test_login_profile_whoami_capabilities(fetch, login):
    body = await login("alice", "wonderland", device_id="PHONE")
    assert body["user_id"] == "@alice:localhost" and body["device_id"] == "PHONE"
    token = body["access_token"]
    assert assert_json(await fetch(WHOAMI, token=token)) == {"user_id": "@alice:localhost", "device_id": "PHONE"}
    caps = assert_json(await fetch(CAPABILITIES, token=token))["capabilities"]
    assert caps["m.set_displayname"] == {"enabled": False}
    assert assert_json(await fetch(PROFILE + "@alice:localhost")) == {
        "displayname": "Alice [alice]",
        "avatar_url": "mxc://localhost/alice",
    }
    assert assert_json(await fetch(PROFILE + quote("@bob:localhost", safe=""))) == {"displayname": "bob-ident"}
    assert assert_json(await fetch(PROFILE + "@alice:localhost/displayname")) == {"displayname": "Alice [alice]"}


@pytest.mark.parametrize(
    ("user", "password", "status", "errcode", "message"),
    [
        ("nobody", "x", 403, "M_FORBIDDEN", "Invalid username"),
        ("alice", "wrong", 403, "M_FORBIDDEN", "Invalid username or password"),
        ("badhex", "secret", 500, "M_UNKNOWN", "Password hash decoding failed"),
        ("notbcrypt", "secret", 500, "M_UNKNOWN", "Password hash decoding failed"),
        # Names no account can have are simply unknown, never a 500 or an odd key.
        ("al\x00ice", "wonderland", 403, "M_FORBIDDEN", "Invalid username"),
        ("alice\n", "wonderland", 403, "M_FORBIDDEN", "Invalid username"),
        ("a" * 300, "x", 403, "M_FORBIDDEN", "Invalid username"),
        ("\ud800", "x", 403, "M_FORBIDDEN", "Invalid username"),
        ("", "x", 403, "M_FORBIDDEN", "Invalid username"),
        ("*", "x", 403, "M_FORBIDDEN", "Invalid username"),
    ],
)
async def test_login_errors(fetch, user, password, status, errcode, message):
    resp = await fetch(LOGIN, "POST", json_body=login_body(user, password))
    assert_error(resp, status, errcode, message)


async def test_case_insensitive_login_uses_the_stored_name(fetch, login):
    body = await login("ALICE", "wonderland")
    assert body["user_id"] == "@alice:localhost"
    whoami = assert_json(await fetch(WHOAMI, token=body["access_token"]))
    assert whoami["user_id"] == "@alice:localhost"
    # Profiles look names up exactly.
    assert_error(await fetch(PROFILE + "@ALICE:localhost"), 404, "M_NOT_FOUND", "Profile not found")


@pytest.mark.parametrize("path", ["@nobody:localhost", "@al%00ice:localhost", "@" + "a" * 300, "%40"])
async def test_profile_not_found(fetch, path):
    assert_error(await fetch(PROFILE + path), 404, "M_NOT_FOUND", "Profile not found")



async def test_an_unusable_stored_password_is_logged_once_per_user(fetch, caplog):
    for name in ("badhex", "notbcrypt", "badhex", "notbcrypt", "badhex"):
        resp = await fetch(LOGIN, "POST", json_body=login_body(name, "secret"))
        assert_error(resp, 500, "M_UNKNOWN", "Password hash decoding failed")
    reports = [r.getMessage() for r in caplog.records if "operator error" in r.getMessage()]
    assert len(reports) == 2, reports
    assert "'badhex'" in reports[0] and "it is not hex text" in reports[0]
    assert "'notbcrypt'" in reports[1] and "not of a bcrypt hash" in reports[1]
