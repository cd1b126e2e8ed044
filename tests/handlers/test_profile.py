"""GET /profile/{userId}: the specification's rules 1-3."""

import pytest

from tests.support.helpers import DEFAULT_USERS, assert_error, assert_json, record
from tests.support.openapi import validate

PROFILE = "/_matrix/client/v3/profile/"


@pytest.fixture
def user_records():
    return [
        *[dict(r) for r in DEFAULT_USERS],
        record("Carol", ident="C"),
        record("empty", ident="-e", display_name="", avatar_url=""),
        record("nulls", ident="-n", display_name=None, avatar_url=None),
        record("a/b", ident="slash"),
        record("ü", ident="umlaut"),
    ]


async def test_display_name_is_stored_name_followed_by_ident(fetch):
    resp = await fetch(PROFILE + "@alice:localhost")
    assert assert_json(resp) == {"displayname": "Alice [alice]", "avatar_url": "mxc://localhost/alice"}
    validate(resp, "profile.yaml", "/profile/{userId}")


async def test_without_display_name_the_ident_alone_and_no_avatar_key(fetch):
    resp = await fetch(PROFILE + "@bob:localhost")
    body = assert_json(resp)
    assert body == {"displayname": "bob-ident"}
    assert b"null" not in resp.body and "tz" not in body and "m.tz" not in body
    validate(resp, "profile.yaml", "/profile/{userId}")


async def test_empty_and_null_optional_fields_are_omitted(fetch):
    assert assert_json(await fetch(PROFILE + "@empty:localhost")) == {"displayname": "-e"}
    assert assert_json(await fetch(PROFILE + "@nulls:localhost")) == {"displayname": "-n"}


async def test_unknown_user_is_404_profile_not_found(fetch):
    resp = await fetch(PROFILE + "@nobody:localhost")
    assert_error(resp, 404, "M_NOT_FOUND", "Profile not found")
    validate(resp, "profile.yaml", "/profile/{userId}")


@pytest.mark.parametrize(
    "user_id, found",
    [
        ("@alice:localhost", "alice"),
        ("%40alice%3Alocalhost", "alice"),
        ("@alice:other.example", "alice"),  # no domain check
        ("@alice", "alice"),  # no ':' at all: everything after the first character
        ("xalice:localhost", "alice"),  # the first character is dropped, whatever it is
        ("@alice:localhost:8448", "alice"),  # text before the FIRST ':'
        ("@a%2Fb:localhost", "a/b"),
        ("@%C3%BC:localhost", "ü"),
        ("@Carol:localhost", "Carol"),
    ],
)
async def test_rule_1_name_from_the_user_id(fetch, user_id, found):
    body = assert_json(await fetch(PROFILE + user_id))
    assert body["displayname"].endswith({"alice": "[alice]", "a/b": "slash", "ü": "umlaut", "Carol": "C"}[found])


@pytest.mark.parametrize(
    "user_id",
    ["@ALICE:localhost", "@carol:localhost", "alice:localhost", "@:localhost", "@", "@al+ice:localhost", "@" + "a" * 300 + ":localhost"],
)
async def test_lookup_is_by_exact_name(fetch, user_id):
    assert_error(await fetch(PROFILE + user_id), 404, "M_NOT_FOUND", "Profile not found")


async def test_no_authentication_needed_and_a_bad_token_is_ignored(fetch):
    assert assert_json(await fetch(PROFILE + "@bob:localhost", token="garbage"))["displayname"] == "bob-ident"


async def test_invalid_utf8_in_the_path_is_400(fetch):
    assert_error(await fetch(PROFILE + "@%FF%FE:localhost"), 400, "M_INVALID_PARAM")


async def test_profile_field_endpoints(fetch):
    assert assert_json(await fetch(PROFILE + "@alice:localhost/displayname")) == {"displayname": "Alice [alice]"}
    assert assert_json(await fetch(PROFILE + "@alice:localhost/avatar_url")) == {"avatar_url": "mxc://localhost/alice"}
    assert_error(await fetch(PROFILE + "@bob:localhost/avatar_url"), 404, "M_NOT_FOUND")
    assert_error(await fetch(PROFILE + "@nobody:localhost/displayname"), 404, "M_NOT_FOUND", "Profile not found")
    assert_error(await fetch(PROFILE + "@alice:localhost/other"), 404, "M_UNRECOGNIZED")
