"""The device authorization grant and `sessions issue` over a real slapd: the person approves with
the directory password, the directory is read again before the tokens are given, and a bot's
token ends when its entry's password changes there."""

from __future__ import annotations

import concurrent.futures
import contextlib
import io

import pytest

from homeserver import cli
from homeserver.oauth import device
from tests.backends.test_oauth_ldap import admin, config_overrides, directory, replace  # noqa: F401 - LDAP, OAuth on
from tests.oauth.device_helpers import DeviceClient, Person
from tests.support.helpers import JWT_SECRET, assert_error, assert_json
from tests.support.slapd import READER_DN, READER_PASSWORD, SUFFIX, crypt_bcrypt

pytestmark = pytest.mark.usefixtures("io_loop")

WHOAMI = "/_matrix/client/v3/account/whoami"


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    monkeypatch.setattr(device, "INTERVAL", 0)


async def test_approved_with_the_directory_password_and_read_again(fetch, admin):  # noqa: F811
    client, person = DeviceClient(fetch), Person(fetch)
    codes = await client.codes("LDAPDEVICE")
    await person.approve(codes["verification_uri_complete"], name="pat", password="pat-pw")
    tokens = assert_json(await client.poll(codes["device_code"]))
    assert assert_json(await fetch(WHOAMI, token=tokens["access_token"]))["user_id"] == "@pat:localhost"
    # Approved, then the password changed in the directory before the program polled: nothing.
    again = await client.codes("LDAPDEVICE2")
    await person.approve(again["verification_uri_complete"])
    replace(admin, "pat", userPassword=crypt_bcrypt("pat-new"))
    refused = await client.poll(again["device_code"])
    assert (refused.status, refused.json["error"]) == (400, "invalid_grant")


async def test_an_issued_token_ends_with_a_password_changed_in_the_directory(fetch, tmp_path, directory, admin):  # noqa: F811
    config = tmp_path / "issue.toml"  # beside the server's: the same sessions.db
    config.write_text(
        f'[auth]\njwt_secret = "{JWT_SECRET}"\n[backend]\ntype = "ldap"\n'
        f'[backend.ldap]\nuri = "{directory.uri}"\nbase = "{SUFFIX}"\nbind_dn = "{READER_DN}"\n'
        f'bind_password = "{READER_PASSWORD}"\nmode = "hash"\n'
    )
    assert (await fetch(WHOAMI)).status == 401  # the server is up: its store exists
    out = io.StringIO()

    def issue() -> int:
        with contextlib.redirect_stdout(out):
            return cli.main(["sessions", "issue", "pat", "--device", "LDAPBOT", "--config", str(config)])

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        assert pool.submit(issue).result() == 0
    token = out.getvalue().strip()
    me = assert_json(await fetch(WHOAMI, token=token))
    assert (me["user_id"], me["device_id"]) == ("@pat:localhost", "LDAPBOT")
    replace(admin, "pat", userPassword=crypt_bcrypt("pat-new"))
    assert_error(await fetch(WHOAMI, token=token), 401, "M_UNKNOWN_TOKEN")
