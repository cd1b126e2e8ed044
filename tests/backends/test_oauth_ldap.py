"""The OAuth 2.0 API over a real slapd: a person signs in on the page with the directory password,
and the directory stays the truth at every refresh (a password changed there, an entry
deleted, a lock)."""

from __future__ import annotations

import pytest

from tests.backends.test_account_state_ldap import admin, directory, replace  # noqa: F401 - its slapd, reused
from tests.oauth.conftest import OAuthClient
from tests.support.helpers import assert_error, assert_json
from tests.support.slapd import PEOPLE, READER_DN, READER_PASSWORD, SUFFIX, crypt_bcrypt

pytestmark = pytest.mark.usefixtures("io_loop")

WHOAMI = "/_matrix/client/v3/account/whoami"


@pytest.fixture
def config_overrides(directory):  # noqa: F811
    ldap = {"uri": directory.uri, "base": SUFFIX, "bind_dn": READER_DN, "bind_password": READER_PASSWORD, "mode": "hash"}
    return {"backend": {"type": "ldap"}, "backend.ldap": ldap, "oauth": {"enabled": True}}


@pytest.fixture
def client(fetch) -> OAuthClient:
    return OAuthClient(fetch)


async def sign_in(client: OAuthClient, user: str, password: str, device: str) -> dict:
    params = await client.params(device)
    client.cookies.clear()
    resp = await client.sign_in(params, name=user, password=password)
    assert resp.status == 303, resp
    code = resp.headers["Location"].split("code=")[1].split("&")[0]
    return assert_json(await client.exchange(code))


def invalid_grant(resp) -> None:
    assert resp.status == 400 and resp.json["error"] == "invalid_grant", resp


async def test_the_directory_is_read_at_every_refresh(client, fetch, admin):  # noqa: F811
    tokens = await sign_in(client, "pat", "pat-pw", "LDAPDEV001")
    assert assert_json(await fetch(WHOAMI, token=tokens["access_token"]))["user_id"] == "@pat:localhost"
    tokens = assert_json(await client.refresh(tokens["refresh_token"]))
    replace(admin, "pat", userPassword=crypt_bcrypt("pat-new"))
    invalid_grant(await client.refresh(tokens["refresh_token"]))
    assert_error(await fetch(WHOAMI, token=tokens["access_token"]), 401, "M_UNKNOWN_TOKEN")
    tokens = await sign_in(client, "pat", "pat-new", "LDAPDEV002")
    admin.delete(f"uid=pat,{PEOPLE}")
    invalid_grant(await client.refresh(tokens["refresh_token"]))


async def test_a_locked_entry_keeps_its_session(client, fetch, admin):  # noqa: F811
    tokens = await sign_in(client, "nora", "nora-pw", "LDAPDEV003")
    replace(admin, "nora", nsAccountLock="TRUE")
    fresh = assert_json(await client.refresh(tokens["refresh_token"]))
    assert_error(await fetch(WHOAMI, token=fresh["access_token"]), 401, "M_USER_LOCKED")
    replace(admin, "nora", nsAccountLock="FALSE")
    assert_json(await fetch(WHOAMI, token=fresh["access_token"]))
