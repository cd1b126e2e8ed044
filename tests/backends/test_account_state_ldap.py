"""Account state on a real slapd: Active Directory's userAccountControl and lockoutTime (an
AD-like schema with their real OIDs), OpenLDAP ppolicy's pwdAccountLockedTime and
pwdChangedTime (the ppolicy overlay), 389-DS / FreeIPA's nsAccountLock, a custom
locked_filter; passwords changed in the directory (hash and bind modes), entries deleted and
created again under the same name. The lock filter is evaluated on the entry the lookup
fetched: it is checked here against slapd's own evaluation of the same filter."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import ldap3
import pytest

from backends.ldap_locks import AD_DISABLED, AD_LOCKED_OUT, OPENLDAP_AND_389, LockFilter
from backends.ldap_settings import IDENTITY_ATTRIBUTES
from homeserver.errors import ConfigError
from homeserver.sessions import token_digest
from tests.support.helpers import assert_error, assert_json, ci
from tests.support.openapi import validate, validate_error
from tests.support.slapd import (
    PEOPLE,
    READER_DN,
    READER_PASSWORD,
    SUFFIX,
    Slapd,
    base_ldif,
    crypt_bcrypt,
    person,
    ppolicy_available,
    require_slapd,
)

WHOAMI = "/_matrix/client/v3/account/whoami"
LOGIN = "/_matrix/client/v3/login"
LOGOUT = "/_matrix/client/v3/logout"
ADMIN_DN, ADMIN_PASSWORD = f"cn=admin,{SUFFIX}", "adminpw"


def policy_ldif() -> str:
    return f"""dn: cn=default-policy,{SUFFIX}
objectClass: pwdPolicy
objectClass: person
cn: default-policy
sn: policy
pwdAttribute: userPassword
"""


def entries() -> str:
    return "\n".join([
        base_ldif(),
        policy_ldif(),
        # Active Directory shaped: a normal account (512), its password set at some time.
        person("ann", objectClass="adUser", userAccountControl="512", pwdLastSet="133000000000000000",
               userPassword=crypt_bcrypt("ann-pw")),
        person("pat", userPassword=crypt_bcrypt("pat-pw")),
        person("nora", objectClass="nsLockable", nsAccountLock="FALSE", userPassword=crypt_bcrypt("nora-pw")),
        person("emp", employeeType="staff", userPassword=crypt_bcrypt("emp-pw")),
    ])


def need_ppolicy() -> None:
    if not ppolicy_available():
        reason = "slapd's ppolicy overlay is not installed: pwdAccountLockedTime and pwdChangedTime untested"
        if ci():
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture
def directory() -> Iterator[Slapd]:
    """A private slapd per test (the tests change entries), with ppolicy."""
    require_slapd()
    need_ppolicy()
    server = Slapd(entries(), tls=False, ppolicy=True)
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def admin(directory) -> Iterator[ldap3.Connection]:
    """The directory's administrator, changing entries as an operator's tools would."""
    conn = ldap3.Connection(
        ldap3.Server("127.0.0.1", port=directory.port, get_info=ldap3.NONE), ADMIN_DN, ADMIN_PASSWORD,
        auto_bind=True, raise_exceptions=True, check_names=False,
    )
    yield conn
    conn.unbind()


def replace(admin: ldap3.Connection, uid: str, **values: Any) -> None:
    changes = {
        name: [(ldap3.MODIFY_REPLACE, [] if value is None else [value])] for name, value in values.items()
    }
    admin.modify(f"uid={uid},{PEOPLE}", changes)


@pytest.fixture
def ldap_extra() -> dict[str, Any]:
    return {}


@pytest.fixture
def session_extra() -> dict[str, Any]:
    return {}


@pytest.fixture
def mode() -> str:
    return "hash"


@pytest.fixture
def config_overrides(directory, ldap_extra, session_extra, mode) -> dict[str, dict[str, Any]]:
    return {
        "backend": {"type": "ldap"},
        "backend.ldap": {
            "uri": directory.uri, "base": SUFFIX, "bind_dn": READER_DN, "bind_password": READER_PASSWORD,
            "timeout": 2.0, "mode": mode, **ldap_extra,
        },
        "sessions": session_extra,
    }


@pytest.fixture
def fetch(fetch, app):
    """As in test_ldap.py: naming `app` lets parametrized fixtures reach it."""
    assert app.settings["homeserver"].backend.settings.mode == app.settings["homeserver"].config.get(
        "backend.ldap", "mode"
    )
    return fetch


def body(user: str, password: str) -> dict[str, Any]:
    return {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user}, "password": password}


async def token_of(fetch: Any, user: str, password: str) -> str:
    return assert_json(await fetch(LOGIN, "POST", json_body=body(user, password)))["access_token"]


async def assert_locked(fetch: Any, token: str) -> None:
    resp = await fetch(WHOAMI, token=token)
    assert assert_error(resp, 401, "M_USER_LOCKED")["soft_logout"] is True
    validate(resp, "whoami.yaml", "/account/whoami")


async def assert_works(fetch: Any, token: str, user: str) -> None:
    resp = await fetch(WHOAMI, token=token)
    assert assert_json(resp)["user_id"] == f"@{user}:localhost"


async def assert_ended(fetch: Any, token: str) -> None:
    resp = await fetch(WHOAMI, token=token)
    assert assert_error(resp, 401, "M_UNKNOWN_TOKEN")["soft_logout"] is False
    validate(resp, "whoami.yaml", "/account/whoami")


async def assert_login_locked(fetch: Any, user: str, password: str) -> None:
    resp = await fetch(LOGIN, "POST", json_body=body(user, password))
    assert assert_error(resp, 401, "M_USER_LOCKED")["soft_logout"] is True
    validate_error(resp)


BOTH_MODES = pytest.mark.parametrize("mode", ["hash", "bind"])
AD = {"active_directory": True}


# -- Active Directory: disabled and locked out ------------------------------------------------


@BOTH_MODES
@pytest.mark.parametrize("ldap_extra", [AD], ids=["ad"])
async def test_ad_disabled_account_is_locked_and_enabling_brings_tokens_back(fetch, admin, ldap_extra, mode, hs):
    token = await token_of(fetch, "ann", "ann-pw")
    replace(admin, "ann", userAccountControl="514")  # 512 + ACCOUNTDISABLE
    await assert_locked(fetch, token)
    await assert_login_locked(fetch, "ann", "ann-pw")
    assert_error(await fetch(LOGIN, "POST", json_body=body("ann", "wrong")), 403, "M_FORBIDDEN")
    assert assert_json(await fetch(LOGOUT, "POST", token=await _second_token(fetch, admin))) == {}
    replace(admin, "ann", userAccountControl="512")
    await assert_works(fetch, token, "ann")
    # A locked-out account (failed logons) is not locked unless the option says so.
    replace(admin, "ann", lockoutTime="133400000000000000")
    await assert_works(fetch, token, "ann")


async def _second_token(fetch: Any, admin: ldap3.Connection) -> str:
    """A second session of ann, logged in while enabled, then logged out while disabled."""
    replace(admin, "ann", userAccountControl="512")
    token = await token_of(fetch, "ann", "ann-pw")
    replace(admin, "ann", userAccountControl="514")
    return token


@pytest.mark.parametrize("ldap_extra", [{**AD, "locked_out_is_locked": True}], ids=["ad-lockout"])
async def test_ad_locked_out_account_with_the_option(fetch, admin, ldap_extra):
    token = await token_of(fetch, "ann", "ann-pw")
    replace(admin, "ann", lockoutTime="133400000000000000")
    await assert_locked(fetch, token)
    replace(admin, "ann", lockoutTime="0")  # what AD writes when the lockout is cleared
    await assert_works(fetch, token, "ann")


# -- OpenLDAP ppolicy, 389-DS / FreeIPA, a custom filter -------------------------------------


@BOTH_MODES
async def test_ppolicy_locked_time_locks(fetch, admin, mode, hs):
    token = await token_of(fetch, "pat", "pat-pw")
    replace(admin, "pat", pwdAccountLockedTime="000001010000Z")  # locked until an administrator unlocks
    await assert_locked(fetch, token)
    await assert_login_locked(fetch, "pat", "pat-pw")
    replace(admin, "pat", pwdAccountLockedTime=None)
    await assert_works(fetch, token, "pat")


async def test_389_ds_account_lock(fetch, admin):
    token = await token_of(fetch, "nora", "nora-pw")
    replace(admin, "nora", nsAccountLock="TRUE")
    await assert_locked(fetch, token)
    replace(admin, "nora", nsAccountLock="false")
    await assert_works(fetch, token, "nora")


@pytest.mark.parametrize("ldap_extra", [{"locked_filter": "employeeType=disabled"}], ids=["custom"])
async def test_custom_locked_filter(fetch, admin, ldap_extra):
    token = await token_of(fetch, "emp", "emp-pw")
    replace(admin, "pat", pwdAccountLockedTime="000001010000Z")  # not what this filter reads
    await assert_works(fetch, await token_of(fetch, "pat", "pat-pw"), "pat")
    replace(admin, "emp", employeeType="Disabled")
    await assert_locked(fetch, token)


# -- passwords changed, entries replaced ----------------------------------------------------


@BOTH_MODES
async def test_a_password_changed_in_the_directory_ends_sessions(fetch, admin, mode, hs):
    # Bind mode sees the change through ppolicy's pwdChangedTime, hash mode through userPassword.
    token = await token_of(fetch, "pat", "pat-pw")
    replace(admin, "pat", userPassword=crypt_bcrypt("pat-new"))
    await assert_ended(fetch, token)
    assert (await hs.sessions.store.get("pat", token_digest(token))).ended_ts is not None
    await assert_works(fetch, await token_of(fetch, "pat", "pat-new"), "pat")


@BOTH_MODES
@pytest.mark.parametrize("session_extra", [{"end_on_password_change": False}], ids=["keep"])
async def test_end_on_password_change_false_keeps_sessions(fetch, admin, session_extra, mode, hs):
    assert hs.credentials.end_on_password_change is False
    token = await token_of(fetch, "pat", "pat-pw")
    replace(admin, "pat", userPassword=crypt_bcrypt("pat-rotated"))
    await assert_works(fetch, token, "pat")


@BOTH_MODES
@pytest.mark.parametrize("session_extra", [{}, {"end_on_password_change": False}], ids=["default", "keep"])
async def test_an_entry_deleted_and_created_again_never_revives_a_token(fetch, admin, directory, session_extra,
                                                                        mode, hs):
    token = await token_of(fetch, "pat", "pat-pw")
    dn = f"uid=pat,{PEOPLE}"
    old_uuid = directory.entry_uuid(dn)
    admin.delete(dn)
    await assert_ended(fetch, token)
    # The same name and the same password, before any sweep: another entry, another account.
    admin.add(dn, ["inetOrgPerson"], {"uid": "pat", "cn": "pat", "sn": "pat", "userPassword": crypt_bcrypt("pat-pw")})
    assert directory.entry_uuid(dn) != old_uuid
    await assert_ended(fetch, token)
    await assert_works(fetch, await token_of(fetch, "pat", "pat-pw"), "pat")


async def test_the_profile_changing_ends_nothing(fetch, admin):
    token = await token_of(fetch, "pat", "pat-pw")
    replace(admin, "pat", displayName="Pat Q.", mail="pat@example.org")
    await assert_works(fetch, token, "pat")


# -- the filter, evaluated here and by slapd --------------------------------------------------


FILTERS = [
    AD_DISABLED,
    AD_LOCKED_OUT,
    f"(|{AD_DISABLED}{AD_LOCKED_OUT})",
    OPENLDAP_AND_389,
    "(userAccountControl:1.2.840.113556.1.4.804:=3)",
    "(&(objectClass=inetOrgPerson)(!(employeeType=staff)))",
    "(cn=*a*)",
    "(pwdLastSet<=133000000000000000)",
    "(employeeType=STAFF)",
]


@pytest.mark.parametrize("text", FILTERS)
def test_the_filter_matches_as_slapd_does(directory, admin, text):
    replace(admin, "ann", userAccountControl="514", lockoutTime="0")
    replace(admin, "pat", pwdAccountLockedTime="20260101000000Z")
    replace(admin, "nora", nsAccountLock="TRUE")
    lock = LockFilter(text)
    admin.search(PEOPLE, "(objectClass=*)", ldap3.SUBTREE, attributes=[*lock.attributes, *IDENTITY_ATTRIBUTES])
    ours = {
        r["dn"] for r in admin.response
        if lock.matches({k.lower(): v for k, v in r["raw_attributes"].items()})
    }
    admin.search(PEOPLE, text, ldap3.SUBTREE, attributes=["1.1"])
    theirs = {r["dn"] for r in admin.response}
    assert ours == theirs


@pytest.mark.parametrize("text", ["(uid=", "(cn:caseExactMatch:=x)", "(:dn:2.5.13.5:=x)"])
def test_filters_the_server_cannot_evaluate_are_refused_at_start_up(text):
    with pytest.raises(ConfigError, match="locked_filter"):
        LockFilter(text)
