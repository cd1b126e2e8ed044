"""Login by e-mail address (m.id.thirdparty, medium email), alike on the file backend and Redis."""

from __future__ import annotations

import pytest

from tests.support.helpers import DEFAULT_USERS, assert_error, assert_json, record
from tests.support.openapi import validate
from tests.support.redis_servers import redis_overrides

LOGIN = "/_matrix/client/v3/login"
WHOAMI = "/_matrix/client/v3/account/whoami"
REFUSED = "Invalid username or password"

USERS = [
    {**DEFAULT_USERS[0], "email": "Alice.Liddell@Example.ORG"},
    DEFAULT_USERS[1],
    record("twin1", "twin-pw", email="twins@example.org"),
    record("twin2", "twin-pw", email="TWINS@example.org"),
]


def by_address(address, password="wonderland", **extra):
    return {"type": "m.login.password", "password": password,
            "identifier": {"type": "m.id.thirdparty", "medium": "email", "address": address}, **extra}


@pytest.fixture
def user_records():
    return [dict(r) for r in USERS]


@pytest.fixture(params=["file", "redis"])
def config_overrides(request):
    if request.param == "file":
        return {}
    return redis_overrides(request.getfixturevalue("redis_users"))


@pytest.fixture(autouse=True)
def _app(app):
    """Put `app` (and so the backend parameter) in every test's fixture closure."""


@pytest.mark.parametrize("address", ["Alice.Liddell@Example.ORG", "alice.liddell@example.org", " ALICE.LIDDELL@EXAMPLE.ORG "])
async def test_login_by_address_names_the_stored_user(fetch, address):
    resp = await fetch(LOGIN, "POST", json_body=by_address(address, device_id="PHONE"))
    body = assert_json(resp)
    validate(resp, "login.yaml", "/login", "POST")
    assert (body["user_id"], body["device_id"]) == ("@alice:localhost", "PHONE")
    whoami = assert_json(await fetch(WHOAMI, token=body["access_token"]))
    assert whoami == {"user_id": "@alice:localhost", "device_id": "PHONE"}


async def test_the_deprecated_top_level_form(fetch):
    body = {"medium": "email", "address": "alice.liddell@example.org", "password": "wonderland"}
    assert assert_json(await fetch(LOGIN, "POST", json_body=body))["user_id"] == "@alice:localhost"


async def test_a_wrong_password_is_refused(fetch):
    assert_error(await fetch(LOGIN, "POST", json_body=by_address("alice.liddell@example.org", "nope")),
                 403, "M_FORBIDDEN", REFUSED)


@pytest.mark.parametrize(
    "address",
    ["nobody@example.org", "twins@example.org", "*", "*@*", ")(", "alice)(mail=*", "al\x00ice@example.org",
     "a" * 300 + "@example.org", "\ud800@example.org", "", "no-at-sign", "@example.org"],
)
async def test_unknown_ambiguous_and_hostile_addresses_look_like_a_wrong_password(fetch, hs, address):
    before = hs.checker.wasted
    resp = await fetch(LOGIN, "POST", json_body=by_address(address))
    assert_error(resp, 403, "M_FORBIDDEN", REFUSED)
    # The same bcrypt work as a wrong password: timing does not tell which addresses exist.
    assert hs.checker.wasted == before + 1


async def test_an_address_held_by_two_users_logs_in_neither(fetch):
    for password in ("twin-pw", "wrong"):
        assert_error(await fetch(LOGIN, "POST", json_body=by_address("twins@example.org", password)),
                     403, "M_FORBIDDEN", REFUSED)


@pytest.mark.parametrize(
    "body, status, errcode",
    [
        ({"identifier": {"type": "m.id.thirdparty", "medium": "msisdn", "address": "4477"}, "password": "x"}, 400, "M_UNKNOWN"),
        ({"identifier": {"type": "m.id.thirdparty", "address": "a@b.c"}, "password": "x"}, 400, "M_MISSING_PARAM"),
        ({"identifier": {"type": "m.id.thirdparty", "medium": "email"}, "password": "x"}, 400, "M_MISSING_PARAM"),
        ({"identifier": {"type": "m.id.thirdparty", "medium": "email", "address": 5}, "password": "x"}, 400, "M_INVALID_PARAM"),
        ({"identifier": {"type": "m.id.thirdparty", "medium": 1, "address": "a@b.c"}, "password": "x"}, 400, "M_INVALID_PARAM"),
        ({"medium": "email", "password": "x"}, 400, "M_MISSING_PARAM"),
        ({"medium": "msisdn", "address": "4477", "password": "x"}, 400, "M_UNKNOWN"),
        (by_address("alice.liddell@example.org") | {"password": None}, 400, "M_MISSING_PARAM"),
    ],
)
async def test_malformed_third_party_logins(fetch, body, status, errcode):
    assert_error(await fetch(LOGIN, "POST", json_body=body), status, errcode)


class TestLimits:
    @pytest.fixture(params=["file", "redis"])
    def config_overrides(self, request):
        limits = {"rate_limit": {"failed_attempts_burst": 2}}
        if request.param == "redis":
            return {**redis_overrides(request.getfixturevalue("redis_users")), **limits}
        return limits

    async def test_failures_count_on_the_address_and_on_the_account(self, fetch):
        for _ in range(2):
            resp = await fetch(LOGIN, "POST", json_body=by_address("Alice.Liddell@example.org", "nope"))
            assert_error(resp, 403, "M_FORBIDDEN")
        # The address is over its failures...
        assert_error(await fetch(LOGIN, "POST", json_body=by_address("alice.liddell@example.org")), 429, "M_LIMIT_EXCEEDED")
        # ...and so is the account it resolved to, whatever name is typed.
        body = {"identifier": {"type": "m.id.user", "user": "alice"}, "password": "wonderland"}
        assert_error(await fetch(LOGIN, "POST", json_body=body), 429, "M_LIMIT_EXCEEDED")

    async def test_unknown_addresses_count_too(self, fetch):
        for _ in range(2):
            assert_error(await fetch(LOGIN, "POST", json_body=by_address("ghost@example.org")), 403, "M_FORBIDDEN")
        assert_error(await fetch(LOGIN, "POST", json_body=by_address("ghost@example.org")), 429, "M_LIMIT_EXCEEDED")
