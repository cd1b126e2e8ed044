"""`admin` and `mfa_required` in each store: users-file records and Redis hashes (read as
`locked` is, written by add_user, kept by an overwrite that keeps them), and the directory's
`admin_filter` / `mfa_required_filter` on groups (memberOf, asked for by name) and attributes.
tests/backends/test_user_listing.py checks the same flags over all three stores at once."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import ldap3
import pytest

from backends.base import STORED_FIELDS, User, stored_fields
from backends.file import FileBackend
from backends.ldap_locks import LockFilter
from backends.ldap_settings import parse_settings
from homeserver.config import build_config
from homeserver.config_schema import SCHEMA
from homeserver.context import create_backend
from homeserver.errors import ConfigError, StoreDataError
from tests.backends.listing_stores import (
    ADMINS_GROUP,
    STAFF_GROUP,
    ListedStore,
    add_group,
    listed_store,
)
from tests.support.helpers import record
from tests.support.redis_servers import redis_overrides
from tests.support.slapd import PEOPLE


def test_the_flags_are_stored_fields_left_out_when_false():
    assert {"locked", "admin", "mfa_required"} <= set(STORED_FIELDS)
    fields = stored_fields(User(name="ann", ident="i", admin=True))
    assert (fields["admin"], fields["mfa_required"], fields["locked"]) == (True, None, None)


# -- the users file ---------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["admin", "mfa_required"])
@pytest.mark.parametrize("value", ["yes", 1, "true"])
async def test_a_flag_that_is_not_true_or_false_stops_the_users_file(tmp_path, flag, value):
    path = tmp_path / "users.json"
    path.write_text(json.dumps({"users": [record("ann", **{flag: value})]}))
    with pytest.raises(ConfigError, match=rf"record 0 \('ann'\): field '{flag}' must be true or false"):
        await FileBackend(str(path)).start()


async def test_add_user_writes_the_flags_and_an_overwrite_keeps_them_when_told(tmp_path):
    path = tmp_path / "users.json"
    backend = FileBackend(str(path))
    await backend.add_user(User(name="ann", ident="i", password="00", admin=True, mfa_required=True))
    (ann,) = json.loads(path.read_text())["users"]
    assert ann["admin"] is True and ann["mfa_required"] is True and "locked" not in ann
    # add-user --overwrite keeps every field it has no option for (homeserver/cli.py).
    await backend.add_user(User(name="ann", ident="j", password="11"), overwrite=True, keep=("admin", "mfa_required"))
    (ann,) = json.loads(path.read_text())["users"]
    assert (ann["ident"], ann["admin"], ann["mfa_required"]) == ("j", True, True)
    await backend.add_user(User(name="ann", ident="j", password="11"), overwrite=True)
    (ann,) = json.loads(path.read_text())["users"]
    assert "admin" not in ann and "mfa_required" not in ann


# -- Redis ------------------------------------------------------------------------------


@pytest.fixture
def config_overrides(request):
    if "redis_users" in request.fixturenames:
        return redis_overrides(request.getfixturevalue("redis_users"))
    return {}


@pytest.mark.parametrize(("value", "expected"), [("true", True), ("yes", True), ("1", True), ("false", False),
                                                 ("", False)])
async def test_redis_flags_are_read_as_locked_is(redis_users, backend, value, expected):
    redis_users.put("ann", password="00", ident="i", admin=value, mfa_required=value)
    ann = await backend.get_user("ann")
    assert (ann.admin, ann.mfa_required) == (expected, expected)


@pytest.mark.parametrize("flag", ["admin", "mfa_required"])
async def test_a_redis_flag_that_is_not_true_or_false_is_a_data_error(redis_users, backend, flag):
    redis_users.put("ann", password="00", ident="i", **{flag: "maybe"})
    with pytest.raises(StoreDataError, match=f"field '{flag}' must be"):
        await backend.get_user("ann")


async def test_redis_add_user_writes_the_flags_and_an_overwrite_keeps_them_when_told(redis_users, backend):
    await backend.add_user(User(name="ann", ident="i", password="00", admin=True, mfa_required=True))
    assert redis_users.get("ann") == {"password": "00", "ident": "i", "admin": "true", "mfa_required": "true"}
    await backend.add_user(User(name="ann", ident="j", password="11"), overwrite=True, keep=("admin", "mfa_required"))
    assert redis_users.get("ann") == {"password": "11", "ident": "j", "admin": "true", "mfa_required": "true"}
    await backend.add_user(User(name="ann", ident="j", password="11"), overwrite=True)
    assert redis_users.get("ann") == {"password": "11", "ident": "j"}


# -- LDAP -------------------------------------------------------------------------------


def ldap_options(**values: Any) -> dict[str, Any]:
    options = {key: field.default for key, field in SCHEMA["backend.ldap"].items()}
    options["attributes"] = {key: field.default for key, field in SCHEMA["backend.ldap.attributes"].items()}
    return {**options, "base": "dc=example,dc=org", **values}


@pytest.mark.parametrize("key", ["admin_filter", "mfa_required_filter"])
@pytest.mark.parametrize(("text", "problem"), [
    ("(memberOf=", "is not a valid LDAP filter"),
    # Active Directory's nested-group rule needs the server: refused, not silently false.
    ("(memberOf:1.2.840.113556.1.4.1941:=cn=admins,dc=example,dc=org)", "only the bitwise matching rules"),
])
def test_a_filter_that_cannot_be_evaluated_is_refused_at_start_up_naming_its_key(key, text, problem):
    with pytest.raises(ConfigError, match=f"backend.ldap.{key}: .*{problem}"):
        parse_settings(ldap_options(**{key: text}), "/")


def test_empty_filters_make_no_admin_and_require_no_second_factor():
    settings = parse_settings(ldap_options(), "/")
    assert settings.admin is None and settings.mfa_required is None
    settings = parse_settings(ldap_options(admin_filter="employeeType=admin"), "/")
    assert settings.admin is not None and settings.admin.text == "(employeeType=admin)"


def test_a_group_dn_matches_however_its_spaces_and_case_are_written():
    group = LockFilter("(memberOf=CN=Matrix Admins, OU=Groups, DC=example, DC=org)", "backend.ldap.admin_filter")
    assert group.attributes == ["memberof"]
    assert group.matches({"memberof": [b"cn=matrix admins,ou=groups,dc=example,dc=org"]})
    assert not group.matches({"memberof": [b"cn=matrix admins,ou=other,dc=example,dc=org"]})
    assert not group.matches({})


def test_a_group_dn_with_escapes_is_compared_by_its_parse():
    # Most groups differ from the filter's in more than spaces and case and are told apart
    # without a parse; a DN with an escape or quotes is parsed, on either side.
    group = LockFilter(r"(memberOf=cn=Smith\, John's team,ou=Groups,dc=example,dc=org)", "backend.ldap.admin_filter")
    assert group.matches({"memberof": [rb"CN=smith\, john's TEAM , ou=groups, dc=example, dc=org"]})
    assert not group.matches({"memberof": [rb"cn=smith\, john's team,ou=other,dc=example,dc=org"]})
    assert not group.matches({"memberof": [b"cn=smith, john's team,ou=groups,dc=example,dc=org"]})
    assert LockFilter("(memberOf=cn=a b,dc=x)", "k").matches({"memberof": [b"CN = A  B , DC=X"]})
    assert not LockFilter("(memberOf=cn=a b,dc=x)", "k").matches({"memberof": [b"cn=ab,dc=x"]})


@pytest.fixture
def groups_slapd(tmp_path) -> Iterator[ListedStore]:
    yield from listed_store("ldap", tmp_path)


@pytest.fixture
def ldap_backend(groups_slapd, make_config, io_loop):
    backend = create_backend(make_config(groups_slapd.overrides))
    io_loop.run_sync(backend.start)
    yield backend
    io_loop.run_sync(backend.close)


async def test_group_membership_is_read_at_each_lookup(groups_slapd, ldap_backend):
    admin = groups_slapd.admin
    assert (await ldap_backend.get_user("alice")).admin
    assert not (await ldap_backend.get_user("dave")).admin
    # dave joins the admins, alice leaves them: the next lookups say so (no cache).
    admin.modify(ADMINS_GROUP, {"member": [(ldap3.MODIFY_ADD, [f"uid=dave,{PEOPLE}"]),
                                           (ldap3.MODIFY_DELETE, [f"uid=alice,{PEOPLE}"])]})
    assert not (await ldap_backend.get_user("alice")).admin
    assert (await ldap_backend.get_user("dave")).admin
    admin.delete(STAFF_GROUP)
    assert not (await ldap_backend.get_user("carol")).mfa_required
    add_group(admin, STAFF_GROUP, ["dave"])
    assert (await ldap_backend.get_user("dave")).mfa_required


def test_the_filters_are_known_keys_with_empty_defaults(caplog):
    with caplog.at_level(logging.WARNING):
        config = build_config({"backend": {"type": "ldap", "ldap": {"admin_filter": "(employeeType=admin)"}}},
                              environ={"HOMESERVER_BACKEND__LDAP__MFA_REQUIRED_FILTER": "(employeeType=staff)"})
    assert caplog.text == ""
    assert config.get("backend.ldap", "admin_filter") == "(employeeType=admin)"
    assert config.get("backend.ldap", "mfa_required_filter") == "(employeeType=staff)"
    assert build_config({}, environ={}).get("backend.ldap", "admin_filter") == ""
