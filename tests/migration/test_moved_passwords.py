"""Records moved from a Synapse (`password_scheme: "synapse"`): their hashes are checked as Synapse
checks them (its pepper, NFKC) by the one password check every form uses, and only theirs."""

from __future__ import annotations

import json

import bcrypt
import pytest

from backends.base import User
from backends.redis import hash_user
from backends.users_file import parse_users
from homeserver.config import build_config
from homeserver.errors import ConfigError, StoreDataError
from homeserver.synapse_passwords import load_pepper
from tests.support.helpers import assert_error, assert_json, record

LOGIN = "/_matrix/client/v3/login"
PEPPER = "pepper-Ünï"


def synapse_hex(password: str, pepper: str = PEPPER) -> str:
    """The hex text of a hash Synapse made (NFKC form, pepper appended, cost 4)."""
    import unicodedata

    raw = (unicodedata.normalize("NFKC", password) + pepper).encode("utf-8")[:72]
    return bcrypt.hashpw(raw, bcrypt.gensalt(4)).hex()


def body_for(user: str, password: str) -> dict[str, object]:
    return {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user}, "password": password}


@pytest.fixture
def user_records():
    return [
        {"name": "moved", "password": synapse_hex("ﬁsh and chips"), "ident": "", "password_scheme": "synapse"},
        record("native", "ﬁsh and chips"),
        # Our own record whose password is the pepper-less text: the pepper is not added to it.
        record("plain", "fish and chips" + PEPPER),
    ]


@pytest.fixture
def config_overrides():
    return {"auth": {"synapse_pepper": PEPPER}}


@pytest.mark.parametrize("password", ["ﬁsh and chips", "fish and chips"])
async def test_a_moved_record_logs_in_with_synapses_password_in_either_form(fetch, password):
    body = assert_json(await fetch(LOGIN, "POST", json_body=body_for("moved", password)))
    assert body["user_id"] == "@moved:localhost"


async def test_a_moved_record_refuses_the_password_without_its_pepper_or_another(fetch):
    for password in ("ﬁsh and chips" + PEPPER, "fish and chip", ""):
        resp = await fetch(LOGIN, "POST", json_body=body_for("moved", password))
        assert_error(resp, 403, "M_FORBIDDEN", "Invalid username or password")


async def test_nothing_changes_for_this_servers_own_records(fetch):
    # Not normalised: the ligature is the password, its NFKC form is another.
    assert_json(await fetch(LOGIN, "POST", json_body=body_for("native", "ﬁsh and chips")))
    assert_error(await fetch(LOGIN, "POST", json_body=body_for("native", "fish and chips")), 403, "M_FORBIDDEN")
    # No pepper added.
    assert_json(await fetch(LOGIN, "POST", json_body=body_for("plain", "fish and chips" + PEPPER)))


async def test_the_account_page_and_uia_check_the_same_way(hs):
    user = await hs.users.get("moved")
    assert user is not None and user.password_scheme == "synapse"
    assert await hs.login.authenticate("moved", "fish and chips", "127.0.0.1", reason="test") == user
    from homeserver.passwords import check_password

    assert await check_password(hs.users, hs.checker, user, "ﬁsh and chips")
    assert not await check_password(hs.users, hs.checker, user, "nope")


@pytest.mark.parametrize("config_overrides", [{}])
async def test_without_the_pepper_configured_a_moved_record_cannot_log_in(fetch, config_overrides):
    resp = await fetch(LOGIN, "POST", json_body=body_for("moved", "fish and chips"))
    assert_error(resp, 403, "M_FORBIDDEN")


def test_the_pepper_from_a_file_keeps_its_spaces(tmp_path):
    path = tmp_path / "pepper"
    path.write_text(" spaced pepper \n")
    path.chmod(0o600)
    config = build_config({"auth": {"synapse_pepper_file": str(path)}}, path=str(tmp_path / "hs.toml"), environ={})
    assert load_pepper(config) == " spaced pepper "
    both = build_config({"auth": {"synapse_pepper_file": str(path), "synapse_pepper": "x"}},
                        path=str(tmp_path / "hs.toml"), environ={})
    with pytest.raises(ConfigError, match=r"auth\.synapse_pepper and auth\.synapse_pepper_file"):
        load_pepper(both)


def test_a_record_naming_an_unknown_scheme_is_refused():
    good = {"name": "a", "password": synapse_hex("x"), "ident": "", "password_scheme": "synapse"}
    assert parse_users({"users": [good]}, "f")["a"].password_scheme == "synapse"
    with pytest.raises(ConfigError, match="password_scheme"):
        parse_users({"users": [{**good, "password_scheme": "argon2"}]}, "f")
    fields = {b"password": b"00", b"ident": b"", b"password_scheme": b"md5"}
    with pytest.raises(StoreDataError, match="password_scheme"):
        hash_user("k", "a", fields)
    assert hash_user("k", "a", {b"password": b"00", b"ident": b""}).password_scheme is None


async def test_add_user_keeps_the_scheme_with_the_hash_and_drops_it_with_a_new_password(tmp_path):
    from backends import file_writer

    path = tmp_path / "users.json"
    moved = {"name": "m", "password": synapse_hex("pw"), "ident": "", "password_scheme": "synapse"}
    path.write_text(json.dumps({"users": [moved]}))
    file_writer.add_user(str(path), User(name="m", ident="new ident"), overwrite=True, keep=["password"])
    [kept] = json.loads(path.read_text())["users"]
    assert (kept["password"], kept["password_scheme"], kept["ident"]) == (moved["password"], "synapse", "new ident")
    file_writer.add_user(str(path), User(name="m", ident="x", password=record("m", "new")["password"]),
                         overwrite=True)
    [replaced] = json.loads(path.read_text())["users"]
    assert "password_scheme" not in replaced
