"""LDAP backend against a real slapd: both modes through the HTTP app, mapping, escaping, TLS."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest

from backends.ldap import LdapUser
from backends.ldap_mapping import first_text, password_text
from backends.ldap_settings import _check_filter
from homeserver.context import create_backend
from homeserver.errors import ConfigError, StoreUnavailable
from homeserver.users import Users
from tests.support.helpers import assert_error, assert_json
from tests.support.slapd import PEOPLE, READER_DN, READER_PASSWORD, SUFFIX, free_port

LOGIN = "/_matrix/client/v3/login"
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@pytest.fixture
def ldap_options(slapd) -> dict[str, Any]:
    """[backend.ldap] for the shared directory; tests parametrize `ldap_extra` to change it."""
    return {
        "uri": slapd.uri,
        "base": SUFFIX,
        "bind_dn": READER_DN,
        "bind_password": READER_PASSWORD,
        "timeout": 2.0,
    }


@pytest.fixture
def ldap_extra() -> dict[str, Any]:
    return {}


@pytest.fixture
def ldap_attributes() -> dict[str, Any]:
    return {}


@pytest.fixture
def config_overrides(ldap_options, ldap_extra, ldap_attributes) -> dict[str, dict[str, Any]]:
    options = {**ldap_options, **ldap_extra}
    return {
        "backend": {"type": "ldap"},
        "backend.ldap": {k: v for k, v in options.items() if v is not None},
        "backend.ldap.attributes": ldap_attributes,
    }


@pytest.fixture
def fetch(fetch, app):
    """The conftest fetch, also naming `app`: pytest-tornasync looks `app` up at run time,
    so without this pytest cannot see that parametrizing `ldap_extra` reaches the app."""
    return fetch


def login_body(user: str, password: str) -> dict[str, Any]:
    return {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user}, "password": password}


async def try_login(fetch, user: str, password: str):
    return await fetch(LOGIN, "POST", json_body=login_body(user, password))


async def profile(fetch, name: str) -> dict[str, Any]:
    return assert_json(await fetch(f"/_matrix/client/v3/profile/@{name}:localhost"))


BIND = pytest.mark.parametrize("ldap_extra", [{"mode": "bind"}], ids=["bind"])
BOTH_MODES = pytest.mark.parametrize("ldap_extra", [{"mode": "hash"}, {"mode": "bind"}], ids=["hash", "bind"])


# -- login and the other endpoints, in both modes ---------------------------------------


@BOTH_MODES
async def test_login_profile_and_capabilities(fetch, login, slapd):
    body = await login("alice", "wonderland")
    assert body["user_id"] == "@alice:localhost"
    assert body["device_id"] == "DUMMY"
    caps = assert_json(await fetch("/_matrix/client/v3/capabilities", token=body["access_token"]))
    assert caps["capabilities"]["m.change_password"] == {"enabled": False}
    who = assert_json(await fetch("/_matrix/client/v3/account/whoami", token=body["access_token"]))
    assert who["user_id"] == "@alice:localhost"
    ident = slapd.entry_uuid(f"uid=alice,{PEOPLE}")
    assert await profile(fetch, "alice") == {"displayname": "Alice" + ident, "avatar_url": "mxc://localhost/alice"}


@BOTH_MODES
async def test_login_failures_keep_the_spec_messages(fetch):
    assert_error(await try_login(fetch, "nobody", "x"), 403, "M_FORBIDDEN", "Invalid username")
    assert_error(await try_login(fetch, "alice", "wrong"), 403, "M_FORBIDDEN", "Invalid username or password")
    assert_error(
        await fetch("/_matrix/client/v3/profile/@nobody:localhost"), 404, "M_NOT_FOUND", "Profile not found"
    )


@BOTH_MODES
@pytest.mark.parametrize(
    "user, password",
    [("bob", "builder"), ("carol", "carol-pw"), ("star*", "star-pw"), ("frank", "frank-pw")],
    ids=["2a", "lower-crypt-2y", "star", "multi-uid"],
)
async def test_bcrypt_variants_log_in(login, user, password):
    assert (await login(user, password))["user_id"] == f"@{user}:localhost"


@BOTH_MODES
async def test_case_insensitive_login_uses_the_stored_name(fetch, login):
    body = await login("ALICE", "wonderland")
    assert body["user_id"] == "@alice:localhost"
    assert_json(await fetch("/_matrix/client/v3/capabilities", token=body["access_token"]))
    # Profiles are exact, as with the other backends.
    assert_error(await fetch("/_matrix/client/v3/profile/@ALICE:localhost"), 404, "M_NOT_FOUND")


@BOTH_MODES
async def test_second_uid_value_is_the_name_that_was_matched(login):
    assert (await login("franky", "frank-pw"))["user_id"] == "@franky:localhost"


async def test_hash_mode_refuses_a_hash_it_cannot_read(fetch, caplog):
    # dave's userPassword is {SSHA}: an operator error in hash mode, never a login;
    # logged once, not on every attempt.
    for _ in range(3):
        assert_error(await try_login(fetch, "dave", "dave-pw"), 500, "M_UNKNOWN", "Password hash decoding failed")
    reports = [r for r in caplog.records if "stored password of user 'dave' cannot be used" in r.getMessage()]
    assert len(reports) == 1, caplog.text


@BIND
async def test_bind_mode_lets_the_directory_check_any_scheme(fetch, login):
    assert (await login("dave", "dave-pw"))["user_id"] == "@dave:localhost"
    assert_error(await try_login(fetch, "dave", "wrong"), 403, "M_FORBIDDEN", "Invalid username or password")


@BIND
@pytest.mark.parametrize("password", ["", "\ud800", "x" * 200])
async def test_bind_mode_refuses_odd_passwords(fetch, password):
    # Empty: an "unauthenticated bind" would succeed; it must be refused before any bind.
    assert_error(await try_login(fetch, "alice", password), 403, "M_FORBIDDEN", "Invalid username or password")


@pytest.mark.parametrize(
    "ldap_extra", [{"mode": "bind", "bind_dn": "", "bind_password": ""}], ids=["anonymous-bind-mode"]
)
async def test_anonymous_search_with_bind_mode(fetch, login):
    assert (await login("alice", "wonderland"))["user_id"] == "@alice:localhost"
    assert_error(await try_login(fetch, "alice", "nope"), 403, "M_FORBIDDEN", "Invalid username or password")


@pytest.mark.parametrize("ldap_extra", [{"bind_dn": "", "bind_password": ""}], ids=["anonymous-hash-mode"])
async def test_hash_mode_without_read_access_is_an_operator_error(fetch):
    # Anonymous users may not read userPassword (the ACL): nothing to check, logged, 500.
    assert_error(await try_login(fetch, "alice", "wonderland"), 500, "M_UNKNOWN", "Password hash decoding failed")


# -- attribute mapping -------------------------------------------------------------------


async def test_default_mapping(backend, slapd):
    alice = await backend.get_user("alice")
    assert isinstance(alice, LdapUser)
    assert alice.dn == f"uid=alice,{PEOPLE}"
    assert alice.ident == slapd.entry_uuid(alice.dn) and UUID.fullmatch(alice.ident)
    assert alice.display_name == "Alice"
    assert alice.avatar_url == "mxc://localhost/alice"  # the label after the space is dropped
    assert bytes.fromhex(alice.password).startswith(b"$2b$04$")


async def test_display_name_falls_back_to_cn_first_value(backend, fetch):
    bob = await backend.get_user("bob")
    assert bob.display_name == "Bob Builder"
    assert bob.avatar_url is None
    assert (await profile(fetch, "bob")) == {"displayname": "Bob Builder" + bob.ident}


async def test_multi_valued_labeled_uri_takes_the_first(backend):
    assert (await backend.get_user("carol")).avatar_url == "mxc://localhost/carol1"


@pytest.mark.parametrize("ldap_attributes", [{"display_name": ["title", "displayName", "cn"]}])
async def test_list_mapping_first_non_empty_wins(backend):
    assert (await backend.get_user("carol")).display_name == "Dr"
    assert (await backend.get_user("alice")).display_name == "Alice"
    assert (await backend.get_user("bob")).display_name == "Bob Builder"


@pytest.mark.parametrize("ldap_attributes", [{"display_name": "title", "avatar_url": []}])
async def test_profile_is_ident_alone_without_a_display_name(fetch, backend):
    alice = await backend.get_user("alice")
    assert await profile(fetch, "alice") == {"displayname": alice.ident}


@pytest.mark.parametrize("ldap_attributes", [{"ident": "employeeNumber"}])
async def test_missing_ident_is_a_500_for_that_user_only(fetch):
    assert (await profile(fetch, "alice"))["displayname"] == "AliceA-1"
    assert_error(await fetch("/_matrix/client/v3/profile/@bob:localhost"), 500, "M_UNKNOWN")


@pytest.mark.parametrize("ldap_attributes", [{"password": "description"}])
async def test_custom_password_attribute_with_hex_text(login):
    assert (await login("erin", "erin-pw"))["user_id"] == "@erin:localhost"


@BOTH_MODES
@pytest.mark.parametrize("ldap_attributes", [{"name": ["uid", "mail"]}])
async def test_name_list_logs_in_by_mail_as_the_uid(login):
    assert (await login("carol@example.org", "carol-pw"))["user_id"] == "@carol:localhost"
    assert (await login("carol", "carol-pw"))["user_id"] == "@carol:localhost"


def test_password_text():
    assert password_text("{CRYPT}$2b$04$abc") == b"$2b$04$abc".hex()
    assert password_text("{crypt}$2y$04$abc") == b"$2y$04$abc".hex()
    assert password_text("{Crypt}$2a$04$abc") == b"$2a$04$abc".hex()
    assert password_text("24326224") == "24326224"  # hex text: as is
    assert password_text("{SSHA}abc") == "{SSHA}abc"  # anything else: as is
    assert password_text("{CRYPT}$1$md5") == "{CRYPT}$1$md5"


# -- names that must never reach a filter unescaped ----------------------------------------

HOSTILE = ["*", "*)(uid=*", "al*", "alice)(uid=*", "\x00", "alice\x00", "(", ")", "\\", "\\2a", "star", "twin",
           "mallory)(|(uid=*", "alice\n", "\ud800", "a" * 300, ""]


@pytest.mark.parametrize("name", HOSTILE)
async def test_hostile_names_find_nobody(backend, fetch, name):
    # Through the service's one door to the store, as every request goes.
    assert await Users(backend).get(name, case_insensitive=True) is None
    assert_error(await try_login(fetch, name, "x"), 403, "M_FORBIDDEN", "Invalid username")


async def test_stored_metacharacters_are_matched_literally(backend):
    assert (await backend.get_user("star*")).name == "star*"


# -- filter, URIs, TLS, secrets ----------------------------------------------------------


@pytest.mark.parametrize("ldap_extra", [{}, {"filter": "(!(employeeType=disabled))"}], ids=["none", "filter"])
async def test_filter_is_anded_with_the_name(fetch, ldap_extra):
    resp = await try_login(fetch, "mallory", "mallory-pw")
    if ldap_extra:
        assert_error(resp, 403, "M_FORBIDDEN", "Invalid username")
    else:
        assert_json(resp)
    assert_json(await try_login(fetch, "alice", "wonderland"))


@pytest.mark.parametrize("ldap_extra", [{"filter": "employeeType=disabled"}])
async def test_filter_without_parentheses(fetch, login):
    """A filter written without its parentheses is still applied: only the entry it matches logs in."""
    await login("mallory", "mallory-pw")
    assert_error(await try_login(fetch, "alice", "wonderland"), 403, "M_FORBIDDEN", "Invalid username")


@pytest.fixture
def dead_first(slapd) -> dict[str, Any]:
    return {"uri": [f"ldap://127.0.0.1:{free_port()}", slapd.uri]}


@pytest.mark.parametrize("mode", ["hash", "bind"])
async def test_uri_list_with_a_dead_first_server(make_config, config_overrides, dead_first, mode):
    config_overrides["backend.ldap"].update(dead_first, mode=mode)
    backend = create_backend(make_config(config_overrides))
    try:
        user = await backend.get_user("alice")
        assert user.display_name == "Alice"
        verdict = await backend.verify_password(user, "wonderland")
        assert verdict is (True if mode == "bind" else None)
    finally:
        await backend.close()


@pytest.mark.parametrize(
    "ldap_extra", [{"uri": [f"ldap://127.0.0.1:{free_port()}", f"ldap://localhost:{free_port()}"]}]
)
async def test_all_servers_down_is_503(fetch):
    resp = await try_login(fetch, "alice", "wonderland")
    assert_error(resp, 503, "M_UNKNOWN")
    assert int(resp.headers["Retry-After"]) > 0


@pytest.fixture
def tls(slapd) -> dict[str, Any]:
    return {"uri": slapd.host_uri, "start_tls": True, "ca_file": slapd.tls["ca"]}


@pytest.mark.parametrize("mode", ["hash", "bind"])
async def test_start_tls(make_config, config_overrides, tls, mode):
    config_overrides["backend.ldap"].update(tls, mode=mode)
    backend = create_backend(make_config(config_overrides))
    try:
        await backend.check_health()
        user = await backend.get_user("alice")
        assert await backend.verify_password(user, "wonderland") is (True if mode == "bind" else None)
        if mode == "bind":
            assert await backend.verify_password(user, "wrong") is False
    finally:
        await backend.close()


@pytest.mark.parametrize(
    "change",
    [
        {"ca_file": ""},  # the test CA is not a system CA
        {"uri": "IP"},  # the certificate names localhost, not 127.0.0.1
    ],
    ids=["unknown-ca", "wrong-host"],
)
async def test_start_tls_checks_the_certificate(make_config, config_overrides, tls, slapd, change):
    tls.update(change)
    if tls["uri"] == "IP":
        tls["uri"] = slapd.uri
    config_overrides["backend.ldap"].update(tls)
    backend = create_backend(make_config(config_overrides))
    try:
        with pytest.raises(StoreUnavailable):
            await backend.get_user("alice")
    finally:
        await backend.close()


async def test_start_tls_without_certificate_checks(make_config, config_overrides, tls):
    tls.update(ca_file="", tls_require_cert=False)
    config_overrides["backend.ldap"].update(tls)
    backend = create_backend(make_config(config_overrides))
    try:
        assert (await backend.get_user("alice")).name == "alice"
    finally:
        await backend.close()


@pytest.mark.parametrize("ldap_extra", [{"bind_password": None, "bind_password_file": "reader.pw"}])
async def test_bind_password_file_relative_to_the_config(tmp_path, login, ldap_extra):
    # The file is read when the backend is built, so it is written by the fixture below.
    assert (await login("alice", "wonderland"))["user_id"] == "@alice:localhost"


@pytest.fixture(autouse=True)
def _reader_password_file(tmp_path):
    path = tmp_path / "reader.pw"
    path.write_text(READER_PASSWORD + "\n")
    path.chmod(0o600)


@pytest.mark.parametrize("ldap_extra", [{"bind_password": "wrong"}])
async def test_wrong_service_password_is_503(fetch):
    assert_error(await try_login(fetch, "alice", "wonderland"), 503, "M_UNKNOWN")
    assert_json(await fetch("/_matrix/client/versions"))


@pytest.mark.parametrize(
    "change, reason",
    [({"base": "ou=nowhere," + SUFFIX}, "cannot be read"), ({"bind_password": "wrong"}, "LDAP directory fault")],
)
async def test_check_health_reads_the_base_with_the_service_bind(make_config, config_overrides, backend, change, reason):
    assert await backend.check_health() is None  # the live directory, as configured
    config_overrides["backend.ldap"].update(change)
    broken = create_backend(make_config(config_overrides))
    try:
        with pytest.raises(StoreUnavailable, match=reason):
            await broken.check_health()
    finally:
        await broken.close()


# -- configuration errors ----------------------------------------------------------------


@pytest.mark.parametrize(
    "change, message",
    [
        ({"bind_password_file": "reader.pw"}, "not both"),
        ({"bind_password": ""}, "needs bind_password"),
        ({"bind_dn": ""}, "set bind_dn"),
        ({"bind_password": None, "bind_password_file": "missing.pw"}, "cannot be read"),
        ({"base": ""}, "backend.ldap.base"),
        ({"uri": "ldap://localhost:389/dc=example"}, "backend.ldap.uri"),
        ({"uri": "http://localhost"}, "backend.ldap.uri"),
        ({"uri": []}, "backend.ldap.uri"),
        ({"filter": "(objectClass=person"}, "backend.ldap.filter"),
        ({"ca_file": "missing.pem"}, "backend.ldap.ca_file"),
        ({"mode": "magic"}, "backend.ldap.mode"),
    ],
)
def test_config_errors(make_config, config_overrides, change, message):
    config_overrides["backend.ldap"].update(change)
    config_overrides["backend.ldap"] = {k: v for k, v in config_overrides["backend.ldap"].items() if v is not None}
    with pytest.raises(ConfigError, match=message):
        create_backend(make_config(config_overrides))


@pytest.mark.parametrize(
    "attributes, message",
    [
        ({"name": []}, "attributes.name"),
        ({"ident": ""}, "attributes.ident"),
        ({"password": []}, "attributes.password"),  # hash mode needs one
        ({"colour": "x"}, None),
    ],
)
def test_attribute_config_errors(make_config, config_overrides, attributes, message):
    config_overrides["backend.ldap.attributes"] = attributes
    if message is None:  # an unknown key only warns
        create_backend(make_config(config_overrides))
        return
    with pytest.raises(ConfigError, match=message):
        create_backend(make_config(config_overrides))


def test_attribute_names_are_checked(make_config, config_overrides):
    config_overrides["backend.ldap.attributes"] = {"display_name": "cn)(uid=*"}
    with pytest.raises(ConfigError, match="not an attribute name"):
        create_backend(make_config(config_overrides))


def test_trailing_slash_uri_is_accepted(make_config, config_overrides, slapd):
    config_overrides["backend.ldap"]["uri"] = slapd.uri + "/"
    assert create_backend(make_config(config_overrides)).settings.uris == [slapd.uri]


def test_active_directory_object_guid_reads_as_its_usual_text():
    # No objectGUID in slapd's schema, so this checks the conversion on raw values alone.
    guid = uuid.UUID("6f9619ff-8b86-d011-b42d-00c04fc964ff")
    assert first_text({"objectguid": [guid.bytes_le]}, ["objectGUID"], "cn=x") == str(guid)
    assert first_text({"ident": [b"\xff\xfe", b"text"]}, ["ident"], "cn=x") == "text"  # not UTF-8: skipped


def test_active_directory_filter_is_accepted():
    assert _check_filter("(&(objectClass=user)(!(userAccountControl:1.2.840.113556.1.4.803:=2)))")


# -- login by e-mail address and the names directory users type (issue 12) ---------------

REFUSED = "Invalid username or password"
STAFF = f"ou=staff,{SUFFIX}"
AD = pytest.mark.parametrize("ldap_extra", [{"active_directory": True}], ids=["ad"])


def by_address(address: str, password: str) -> dict[str, Any]:
    return {"type": "m.login.password", "password": password,
            "identifier": {"type": "m.id.thirdparty", "medium": "email", "address": address}}


@BOTH_MODES
@pytest.mark.parametrize("address", ["Grace.Hopper@Example.ORG", "grace.hopper@example.org", "GRACE.HOPPER@EXAMPLE.ORG"])
async def test_login_by_mail_in_both_modes(fetch, address):
    body = assert_json(await fetch(LOGIN, "POST", json_body=by_address(address, "grace-pw")))
    assert body["user_id"] == "@grace:localhost"
    assert_error(await fetch(LOGIN, "POST", json_body=by_address(address, "nope")), 403, "M_FORBIDDEN", REFUSED)


async def test_the_deprecated_top_level_form(fetch):
    body = {"medium": "email", "address": "grace.hopper@example.org", "password": "grace-pw"}
    assert assert_json(await fetch(LOGIN, "POST", json_body=body))["user_id"] == "@grace:localhost"


@pytest.mark.parametrize(
    "address",
    ["shared@example.org", "nobody@example.org", "*", "*@example.org", ")(", "grace.hopper@example.org)(uid=*",
     "x)(|(mail=*", "gr\x00ace@example.org", "a" * 300 + "@example.org"],
)
async def test_ambiguous_unknown_and_hostile_addresses(fetch, hs, address):
    before = hs.checker.wasted
    resp = await fetch(LOGIN, "POST", json_body=by_address(address, "dup-pw"))
    assert_error(resp, 403, "M_FORBIDDEN", REFUSED)
    assert hs.checker.wasted == before + 1  # the same bcrypt work as a wrong password


@pytest.mark.parametrize("ldap_attributes", [{"email": ["description", "mail"]}], ids=["email-list"])
async def test_the_email_attribute_is_configurable(fetch):
    body = assert_json(await fetch(LOGIN, "POST", json_body=by_address("bob@example.org", "builder")))
    assert body["user_id"] == "@bob:localhost"


@AD
@pytest.mark.parametrize("typed", ["CORP\\hwin", "corp\\HWIN", "hwin@corp.example.com", "HWin@Corp.Example.com"])
async def test_active_directory_logon_names(fetch, typed):
    resp = await try_login(fetch, typed, "hwin-pw")
    body = assert_json(resp)
    assert body["user_id"] == "@hwin:localhost"
    assert_error(await try_login(fetch, typed, "nope"), 403, "M_FORBIDDEN", REFUSED)


@AD
async def test_element_sends_a_upn_as_an_address(fetch):
    body = assert_json(await fetch(LOGIN, "POST", json_body=by_address("hwin@corp.example.com", "hwin-pw")))
    assert body["user_id"] == "@hwin:localhost"
    body = assert_json(await fetch(LOGIN, "POST", json_body=by_address("hal.win@example.org", "hwin-pw")))
    assert body["user_id"] == "@hwin:localhost"


@AD
@pytest.mark.parametrize("typed", ["CORP\\*", "CORP\\", "*\\hwin)(uid=*", "*@corp.example.com", "CORP\\hwin\x00"])
async def test_hostile_active_directory_names(fetch, typed):
    resp = await try_login(fetch, typed, "hwin-pw")
    assert_error(resp, 403, "M_FORBIDDEN")


async def test_active_directory_names_need_the_switch(fetch):
    assert_error(await try_login(fetch, "CORP\\hwin", "hwin-pw"), 403, "M_FORBIDDEN", "Invalid username")


@pytest.mark.parametrize("ldap_extra", [{"base": [PEOPLE, STAFF]}], ids=["two-bases"])
async def test_several_bases_searched_in_order(fetch):
    assert (await login_ok(fetch, "ivan", "ivan-pw")) == "@ivan:localhost"
    body = assert_json(await fetch(LOGIN, "POST", json_body=by_address("ivan@example.org", "ivan-pw")))
    assert body["user_id"] == "@ivan:localhost"
    # The twin under ou=people answers first; its double under ou=staff is never reached.
    assert (await login_ok(fetch, "twin", "twin-pw")) == "@twin:localhost"


@pytest.mark.parametrize("ldap_extra", [{"base": PEOPLE}], ids=["people-only"])
async def test_one_base_does_not_see_the_other(fetch):
    assert_error(await try_login(fetch, "ivan", "ivan-pw"), 403, "M_FORBIDDEN", "Invalid username")


@pytest.mark.parametrize("ldap_extra", [{"lowercase_user_ids": True}], ids=["lowercase"])
async def test_lowercase_user_ids(fetch):
    body = assert_json(await try_login(fetch, "Judy", "judy-pw"))
    assert body["user_id"] == "@judy:localhost"
    assert assert_json(await try_login(fetch, "judy", "judy-pw"))["user_id"] == "@judy:localhost"
    whoami = assert_json(await fetch("/_matrix/client/v3/account/whoami", token=body["access_token"]))
    assert whoami["user_id"] == "@judy:localhost"
    assert (await profile(fetch, "judy"))["displayname"].startswith("Judy")


async def test_without_lowercasing_the_stored_case_is_kept(fetch):
    assert assert_json(await try_login(fetch, "judy", "judy-pw"))["user_id"] == "@Judy:localhost"


async def login_ok(fetch, user: str, password: str) -> str:
    return assert_json(await try_login(fetch, user, password))["user_id"]
