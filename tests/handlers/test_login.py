"""POST/GET /login: the specification's rules 1-6 in order, and the decisions around them."""

import asyncio
import json
import time

import bcrypt
import pytest
from jose import jwt

from tests.support.helpers import (
    DEFAULT_USERS,
    JWT_SECRET,
    assert_error,
    assert_json,
    hex_hash,
    record,
)
from tests.support.openapi import validate

LOGIN = "/_matrix/client/v3/login"


def body_for(user="alice", password="wonderland", **extra):
    body = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user}, "password": password}
    body.update(extra)
    return body


def claims(token):
    return jwt.decode(token, JWT_SECRET, algorithms=["HS256"])


async def test_get_login_lists_only_the_password_flow(fetch):
    # Complement sends a {} body with GET; it is ignored.
    resp = await fetch(LOGIN, headers={"Content-Type": "application/json"}, body="{}")
    assert assert_json(resp) == {"flows": [{"type": "m.login.password"}]}
    validate(resp, "login.yaml", "/login")


async def test_login_succeeds_with_the_specified_response(fetch):
    resp = await fetch(LOGIN, "POST", json_body=body_for())
    body = assert_json(resp)
    assert set(body) == {"user_id", "access_token", "home_server", "device_id"}
    assert body["user_id"] == "@alice:localhost"
    assert body["home_server"] == "localhost"
    assert body["device_id"] == "DUMMY"
    # Rule 1: HS256 compact JWS of the name and the device id, no third claim by default.
    assert jwt.get_unverified_header(body["access_token"])["alg"] == "HS256"
    assert claims(body["access_token"]) == {"sub": "alice", "device_id": "DUMMY"}
    validate(resp, "login.yaml", "/login", "POST")


@pytest.mark.parametrize("config_overrides", [{"server": {"server_name": "example.org"}}])
async def test_user_id_and_home_server_use_the_server_name(fetch, config_overrides):
    body = assert_json(await fetch(LOGIN, "POST", json_body=body_for("@alice:example.org")))
    assert body["user_id"] == "@alice:example.org" and body["home_server"] == "example.org"


class FailingIssuer:
    def issue(self, name, device_id):
        raise RuntimeError("signing is broken")


async def test_rule_2_token_failure_comes_before_the_user_lookup(fetch, hs):
    hs.tokens = hs.login.tokens = FailingIssuer()
    for user in ("alice", "nobody"):
        resp = await fetch(LOGIN, "POST", json_body=body_for(user))
        assert_error(resp, 403, "M_UNKNOWN", "Access Token generation failed")


async def test_rule_3_unknown_user(fetch):
    resp = await fetch(LOGIN, "POST", json_body=body_for("i-dont-exist", "XXX"))
    assert_error(resp, 403, "M_FORBIDDEN", "Invalid username")
    validate(resp, "login.yaml", "/login", "POST")


@pytest.fixture
def config(make_config, config_overrides):
    """The test's config, loading records with unusable passwords (rule 4) as Redis or LDAP serve them."""
    return make_config({**config_overrides, "backend.file": {"check_passwords": False}})


@pytest.fixture
def user_records():
    return [
        *[dict(r) for r in DEFAULT_USERS],
        {"name": "badhex", "password": "not hex at all", "ident": "x"},
        {"name": "oddhex", "password": hex_hash("pw")[:-1], "ident": "x"},
        {"name": "notbcrypt", "password": b"plain text, not a hash".hex(), "ident": "x"},
        record("Mixed", "mixedpw", "m"),
        record("twin", "pw1", "t"), record("TWIN", "pw2", "T"),
        record("dup", "first", "d"), record("DUP", "second", "D"),
        {"name": "a2a", "password": hex_hash("pw-2a", prefix=b"$2a$"), "ident": "a"},
        {"name": "a2y", "password": hex_hash("pw-2y", prefix=b"$2y$"), "ident": "y"},
    ]


async def test_rule_4_stored_hash_not_hex(fetch, caplog):
    for name in ("badhex", "oddhex"):
        resp = await fetch(LOGIN, "POST", json_body=body_for(name, "pw"))
        assert_error(resp, 500, "M_UNKNOWN", "Password hash decoding failed")
    assert any("operator error" in r.getMessage() and "badhex" in r.getMessage() for r in caplog.records)


async def test_rule_4_hex_that_is_not_bcrypt_is_a_decoding_failure(fetch):
    resp = await fetch(LOGIN, "POST", json_body=body_for("notbcrypt", "pw"))
    assert_error(resp, 500, "M_UNKNOWN", "Password hash decoding failed")


async def test_rule_4_comes_before_the_password_check(fetch):
    # Even a wrong password gets the decoding error: the hash is decoded first.
    resp = await fetch(LOGIN, "POST", json_body=body_for("badhex", "wrong"))
    assert_error(resp, 500, "M_UNKNOWN", "Password hash decoding failed")


async def test_rule_5_wrong_password(fetch):
    resp = await fetch(LOGIN, "POST", json_body=body_for("alice", "wrong"))
    assert_error(resp, 403, "M_FORBIDDEN", "Invalid username or password")


async def test_full_user_id_is_reduced_to_the_name(login):
    assert (await login("@alice:localhost"))["user_id"] == "@alice:localhost"


async def test_full_user_id_of_another_server_is_nobody(fetch):
    resp = await fetch(LOGIN, "POST", json_body=body_for("@alice:elsewhere.org"))
    assert_error(resp, 403, "M_FORBIDDEN", "Invalid username")


async def test_case_insensitive_fallback_uses_the_stored_name(fetch, login):
    body = await login("@MIXED:localhost", "mixedpw")
    assert body["user_id"] == "@Mixed:localhost"
    assert claims(body["access_token"])["sub"] == "Mixed"
    # whoami works with that token (Complement's upper-case login test).
    who = assert_json(await fetch("/_matrix/client/v3/account/whoami", token=body["access_token"]))
    assert who["user_id"] == "@Mixed:localhost"
    assert (await login("mixed", "mixedpw"))["user_id"] == "@Mixed:localhost"


async def test_exact_name_wins_over_the_case_insensitive_match(login):
    assert (await login("twin", "pw1"))["user_id"] == "@twin:localhost"
    assert (await login("TWIN", "pw2"))["user_id"] == "@TWIN:localhost"


async def test_ambiguous_case_insensitive_match_finds_nobody(fetch):
    resp = await fetch(LOGIN, "POST", json_body=body_for("Dup", "first"))
    assert_error(resp, 403, "M_FORBIDDEN", "Invalid username")


async def test_legacy_top_level_user_field(login, fetch):
    body = {"type": "m.login.password", "user": "alice", "password": "wonderland"}
    assert assert_json(await fetch(LOGIN, "POST", json_body=body))["user_id"] == "@alice:localhost"
    body["user"] = "@alice:localhost"
    assert assert_json(await fetch(LOGIN, "POST", json_body=body))["user_id"] == "@alice:localhost"


async def test_identifier_wins_over_legacy_user(fetch):
    body = body_for("alice")
    body["user"] = "bob"
    assert assert_json(await fetch(LOGIN, "POST", json_body=body))["user_id"] == "@alice:localhost"


async def test_type_and_identifier_type_may_be_absent(fetch):
    body = {"identifier": {"user": "alice"}, "password": "wonderland"}
    assert assert_json(await fetch(LOGIN, "POST", json_body=body))["user_id"] == "@alice:localhost"


async def test_device_id_is_echoed_and_carried_in_the_token(fetch, login):
    body = await login(device_id="my_super_id")
    assert body["device_id"] == "my_super_id"
    assert claims(body["access_token"]) == {"sub": "alice", "device_id": "my_super_id"}
    who = assert_json(await fetch("/_matrix/client/v3/account/whoami", token=body["access_token"]))
    assert who == {"user_id": "@alice:localhost", "device_id": "my_super_id"}


@pytest.mark.parametrize("config_overrides", [{"auth": {"token_lifetime": 3600}}])
async def test_token_lifetime_adds_exp(login, config_overrides):
    token_claims = claims((await login())["access_token"])
    assert set(token_claims) == {"sub", "device_id", "exp"}


async def test_bcrypt_hashes_from_other_tools_verify(login):
    assert (await login("a2a", "pw-2a"))["user_id"] == "@a2a:localhost"
    assert (await login("a2y", "pw-2y"))["user_id"] == "@a2y:localhost"


LONG = "ä" * 50  # 100 UTF-8 bytes


@pytest.mark.parametrize(
    "user_records",
    [[record("long", LONG, "l"), record("euro", "€" * 24, "e"), record("nul", "a\x00b", "n")]],
)
async def test_passwords_are_utf8_cut_to_72_bytes(fetch, login, user_records):
    # The hash of the first 72 bytes matches the long password and its 72-byte prefix.
    assert (await login("long", LONG))["user_id"] == "@long:localhost"
    assert (await login("long", "ä" * 36))["user_id"] == "@long:localhost"
    assert (await login("long", LONG + "anything after byte 72"))["user_id"] == "@long:localhost"
    # 24 euro signs are exactly 72 bytes; a 25th falls beyond bcrypt's limit.
    assert (await login("euro", "€" * 25))["user_id"] == "@euro:localhost"
    assert (await login("nul", "a\x00b"))["user_id"] == "@nul:localhost"
    for password in ("x" * 10_000, "ä" * 35, "a\x00c", "\ud800"):
        resp = await fetch(LOGIN, "POST", json_body=body_for("long", password))
        assert_error(resp, 403, "M_FORBIDDEN", "Invalid username or password")


async def test_lone_surrogate_password_is_a_plain_mismatch(fetch):
    # JSON may carry "\ud800"; it must not become a 500 on encoding.
    raw = '{"identifier": {"user": "alice"}, "password": "\\ud800"}'
    resp = await fetch(LOGIN, "POST", body=raw)
    assert_error(resp, 403, "M_FORBIDDEN", "Invalid username or password")


@pytest.mark.parametrize(
    "raw, errcode",
    [
        (b"", "M_NOT_JSON"),
        (b"not json", "M_NOT_JSON"),
        (b'{"identifier": {"user": "alice"}, "password": "a\x81"}', "M_NOT_JSON"),
        (b'{"identifier": {"user": "alice"}, "password": NaN}', "M_NOT_JSON"),
        (b'{"identifier": {"user": "alice"}, "password": Infinity}', "M_NOT_JSON"),
        (b'{"a": -Infinity}', "M_NOT_JSON"),
        (b"[" * 100_00 + b"]" * 100_00, "M_NOT_JSON"),
        (b'{"a": 1' + b"1" * 5000 + b"}", "M_NOT_JSON"),
        (b"[]", "M_BAD_JSON"),
        (b'"alice"', "M_BAD_JSON"),
        (b"null", "M_BAD_JSON"),
        (b"42", "M_BAD_JSON"),
    ],
)
async def test_bodies_that_are_not_a_json_object(fetch, raw, errcode):
    assert_error(await fetch(LOGIN, "POST", body=raw), 400, errcode)


@pytest.mark.parametrize(
    "body, errcode, message",
    [
        ({"identifier": {"user": "alice"}}, "M_MISSING_PARAM", None),
        ({"password": "wonderland"}, "M_MISSING_PARAM", None),
        ({"identifier": {"type": "m.id.user"}, "password": "x"}, "M_MISSING_PARAM", None),
        ({"identifier": "alice", "password": "x"}, "M_INVALID_PARAM", None),
        ({"identifier": {"user": 42}, "password": "x"}, "M_INVALID_PARAM", None),
        ({"identifier": {"user": "alice"}, "password": 42}, "M_INVALID_PARAM", None),
        ({"identifier": {"user": "alice"}, "password": None}, "M_MISSING_PARAM", None),
        ({"identifier": {"user": "alice", "type": 7}, "password": "x"}, "M_INVALID_PARAM", None),
        ({"user": ["alice"], "password": "x"}, "M_INVALID_PARAM", None),
        ({"identifier": {"user": "alice"}, "password": "x", "type": 1}, "M_INVALID_PARAM", None),
        ({"identifier": {"user": "alice"}, "password": "x", "device_id": 5}, "M_INVALID_PARAM", None),
        ({"identifier": {"user": "alice"}, "password": "x", "device_id": ""}, "M_INVALID_PARAM", None),
        ({"identifier": {"user": "alice"}, "password": "x", "device_id": "d" * 513}, "M_INVALID_PARAM", None),
        ({"identifier": {"user": "alice"}, "password": "x", "type": "m.login.token"}, "M_UNKNOWN", "Bad login type."),
        ({"identifier": {"user": "alice"}, "password": "x", "type": ""}, "M_UNKNOWN", "Bad login type."),
        ({"identifier": {"type": "m.id.thirdparty", "medium": "msisdn", "address": "441234"}, "password": "x"}, "M_UNKNOWN", None),
        ({"identifier": {"type": "m.id.phone", "country": "GB", "phone": "1"}, "password": "x"}, "M_UNKNOWN", None),
        ({"medium": "msisdn", "address": "441234", "password": "x"}, "M_UNKNOWN", None),
    ],
)
async def test_malformed_login_requests(fetch, body, errcode, message):
    resp = await fetch(LOGIN, "POST", json_body=body)
    assert_error(resp, 400, errcode, message)


async def test_body_over_the_limit_is_413_too_large(fetch):
    big = json.dumps(body_for(password="x" * 70_000))
    assert_error(await fetch(LOGIN, "POST", body=big), 413, "M_TOO_LARGE")


async def test_chunked_body_over_the_limit_is_413_too_large(fetch):
    async def producer(write):
        for _ in range(20):
            await write(b"x" * 8192)

    resp = await fetch(LOGIN, "POST", body_producer=producer)
    assert_error(resp, 413, "M_TOO_LARGE")


async def test_a_slow_login_does_not_stall_other_requests(fetch, hs):
    # A cost-14 hash takes about a second: /versions must answer while it runs.
    hs.backend.users["slow"] = hs.backend.users["alice"].__class__(
        name="slow", ident="s", password=bcrypt.hashpw(b"pw", bcrypt.gensalt(14)).hex()
    )
    login_task = asyncio.ensure_future(fetch(LOGIN, "POST", json_body=body_for("slow", "pw")))
    # Until the login's password check is on the bcrypt pool: /versions is asked while it runs.
    deadline = time.monotonic() + 30
    while hs.checker.pending == 0:
        assert not login_task.done() and time.monotonic() < deadline, "the login never reached its password check"
        await asyncio.sleep(0.005)
    versions = await fetch("/_matrix/client/versions")
    assert versions.status == 200
    assert hs.checker.pending == 1 and not login_task.done(), "the login should still be checking its password"
    assert_json(await login_task)


@pytest.mark.parametrize("config_overrides", [{"auth": {"max_pending_logins": 1, "bcrypt_workers": 1}}])
async def test_login_flood_past_the_queue_bound_gets_429(fetch, hs, config_overrides):
    hs.backend.users["slow"] = hs.backend.users["alice"].__class__(
        name="slow", ident="s", password=bcrypt.hashpw(b"pw", bcrypt.gensalt(12)).hex()
    )
    results = await asyncio.gather(*(fetch(LOGIN, "POST", json_body=body_for("slow", "pw")) for _ in range(4)))
    statuses = sorted(r.status for r in results)
    assert statuses[0] == 200 and 429 in statuses, results
    refused = next(r for r in results if r.status == 429)
    body = assert_error(refused, 429, "M_LIMIT_EXCEEDED")
    assert body["retry_after_ms"] > 0 and int(refused.headers["Retry-After"]) >= 1
