"""`migrate-synapse check` as a service (homeserver/migration/check.py): configs that must fail,
every warning, and the counts, on Synapse databases of both kinds filled row by row, and a
file and an LDAP user store against a real Synapse that made its own state."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

from backends.base import StoreUnavailable, User, UserBackend
from homeserver.context import create_backend
from homeserver.migration.check import check
from tests.migration.test_synapse_tokens import synapse_made
from tests.support.helpers import TEST_ROUNDS
from tests.support.synapse_before import LDAP_USER, PEPPER

NOW = 1_800_000_000_000
HASH4 = "$2b$04$" + "a" * 53
HASH12 = "$2b$12$" + "b" * 53
MACAROON = "MDAxN2xvY2F0aW9uIGxvY2FsaG9zdAowMDEzaWRlbnRpZmllciBrZXkKMDAxMGNpZCBnZW4gPSAx"
DELEGATION = {"enabled": True, "synapse_url": "http://127.0.0.1:1", "secret": "s" * 40, "admins": ["root"]}


def synapse_yaml(folder: Path, database: dict, **settings) -> str:
    path = folder / "homeserver.yaml"
    path.write_text(json.dumps({"server_name": "localhost", "database": database, **settings}))
    return str(path)


@pytest.fixture
def empty_sqlite(tmp_path, synapse_schema_sqlite) -> dict:
    path = tmp_path / "synapse.db"
    path.write_bytes(synapse_schema_sqlite.read_bytes())
    return {"name": "sqlite3", "args": {"database": str(path)}}


async def run_check(config, path, **kwargs):
    backend = create_backend(config)
    await backend.start()
    try:
        return await check(path, config, backend, **kwargs)
    finally:
        await backend.close()


def assert_well_formed(report) -> list[str]:
    lines = report.lines()
    assert all(line.startswith(("error: ", "warning: ")) for line in lines[:-1]), lines
    assert lines[-1].startswith("summary: ") and "\n" not in "".join(lines)
    levels = [line.split(":")[0] for line in lines[:-1]]
    assert levels == sorted(levels)  # errors first
    return lines


# -- configs that must fail -------------------------------------------------------------


async def test_a_clean_move_finds_nothing(tmp_path, make_config, empty_sqlite):
    report = await run_check(make_config({"delegation": DELEGATION}), synapse_yaml(tmp_path, empty_sqlite))
    assert assert_well_formed(report) == [
        "summary: 0 errors, 0 warnings; 0 users, 0 devices, 0 access tokens (0 live), 0 refresh tokens (0 live)"]
    assert report.ok


async def test_guest_access_is_an_error(tmp_path, make_config, empty_sqlite):
    report = await run_check(make_config({"delegation": DELEGATION}),
                             synapse_yaml(tmp_path, empty_sqlite, allow_guest_access=True))
    assert not report.ok
    assert assert_well_formed(report)[0] == (
        "error: guest access is on in Synapse (allow_guest_access): guests cannot move here; "
        "turn it off and restart Synapse first")
    assert report.lines()[-1].startswith("summary: 1 error, 0 warnings; 0 users")


async def test_another_server_name_is_an_error(tmp_path, make_config, empty_sqlite):
    path = synapse_yaml(tmp_path, empty_sqlite)
    report = await run_check(make_config({"delegation": DELEGATION, "server": {"server_name": "example.org"}}), path)
    assert [str(e) for e in report.errors] == [
        "error: Synapse's server_name is 'localhost' but this server's [server] server_name is 'example.org': "
        "every user ID would change; set server_name = 'localhost' here"]


@pytest.mark.parametrize(("database", "needle"), [
    ({"name": "sqlite3", "args": {"database": "/nonexistent/homeserver.db"}},
     "the SQLite database /nonexistent/homeserver.db: no such file"),
    ({"name": "mysql", "args": {}}, "database.name: unsupported database type 'mysql'"),
    ({"name": "psycopg2", "args": {"host": "127.0.0.1", "port": 1, "password": "hunter2", "database": "s"}},
     "cannot connect to the PostgreSQL database s on 127.0.0.1 port 1"),
])
async def test_a_database_it_cannot_read_is_an_error(tmp_path, make_config, database, needle):
    report = await run_check(make_config({"delegation": DELEGATION}), synapse_yaml(tmp_path, database))
    lines = assert_well_formed(report)
    assert lines[0].startswith("error: Synapse's database cannot be read: ") and needle in lines[0]
    assert "hunter2" not in " ".join(lines)
    assert lines[-1] == "summary: 1 error, 0 warnings; Synapse's database was not read"


async def test_no_postgres_driver_is_an_error_line(tmp_path, make_config, monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)
    report = await run_check(make_config({"delegation": DELEGATION}),
                             synapse_yaml(tmp_path, {"name": "psycopg2", "args": {"database": "synapse"}}))
    assert str(report.errors[0]).startswith(
        "error: Synapse's database cannot be read: reading a PostgreSQL Synapse needs psycopg 3: install it with")


async def test_a_config_it_cannot_read_is_an_error(tmp_path, make_config):
    path = tmp_path / "homeserver.yaml"
    path.write_text("database: [\n")
    report = await run_check(make_config({"delegation": DELEGATION}), str(path))
    assert [str(e) for e in report.errors] == [
        f"error: Synapse's config cannot be read: Synapse config {path}: not valid YAML at line 2, column 1: "
        "expected the node content, but found '<stream end>'"]


async def test_a_user_store_it_cannot_read_is_an_error(tmp_path, make_config, empty_sqlite):
    rows_path = empty_sqlite["args"]["database"]
    import sqlite3

    with sqlite3.connect(rows_path) as conn:
        conn.execute("INSERT INTO users (name, password_hash) VALUES ('@alice:localhost', ?)", (HASH4,))
    conn.close()

    class Down(UserBackend):
        name = "down"

        @classmethod
        def from_config(cls, options, *, config_dir):
            return cls()

        async def get_user(self, name: str, *, case_insensitive: bool = False) -> User | None:
            raise StoreUnavailable("Redis unreachable")

    config = make_config({"delegation": DELEGATION})
    report = await check(synapse_yaml(tmp_path, empty_sqlite), config, Down())
    assert [str(e) for e in report.errors] == ["error: this server's user store cannot be read: Redis unreachable"]


# -- warnings from the config -------------------------------------------------------------


async def test_warnings_from_synapses_config(tmp_path, make_config, empty_sqlite):
    path = synapse_yaml(
        tmp_path, empty_sqlite,
        oidc_providers=[{"idp_id": "keycloak", "issuer": "https://kc/", "client_id": "x"}],
        saml2_config={"sp_config": {}}, cas_config={"server_url": "https://cas/"}, jwt_config={"enabled": True},
        enable_registration=True, enable_registration_captcha=True,
        password_config={"pepper": "a-secret-pepper"},
        modules=[{"module": "ldap_auth_provider.LdapAuthProviderModule", "config": {}}],
        password_providers=[{"module": "rest_auth_provider.RestAuthProvider", "config": {}}],
        session_lifetime="1d", user_consent={"version": "1.0"}, login_via_existing_session={"enabled": True},
        enable_3pid_changes=True, matrix_authentication_service={"enabled": True},
    )
    report = await run_check(make_config(), path)
    lines = assert_well_formed(report)
    assert report.ok
    assert lines[:-1] == [
        "warning: Synapse already hands its logins to an authentication service (matrix_authentication_service): "
        "sessions made there are not in Synapse's database and are not carried",
        "warning: [delegation] is off in this server's config: moved sessions keep clients signed in only once "
        "Synapse asks this server about its tokens ([delegation] enabled)",
        *[f"warning: {kind} login is configured in Synapse: single sign-on is not carried; its users log in here "
          "with a password in this server's user store, and Synapse refuses to start with it under delegation "
          "(remove it at the switch)" for kind in ("OpenID Connect (oidc-keycloak)", "SAML", "CAS", "JWT")],
        "warning: registration is open in Synapse (enable_registration), with a captcha: Synapse refuses it under "
        "delegation; after the switch accounts are made in this server's user store (add-user, or the directory)",
        "warning: Synapse's passwords carry a pepper (password_config.pepper): the moved password hashes are "
        "checked with it, so it moves here too and must stay secret and unchanged; this server's [auth] "
        "synapse_pepper (or synapse_pepper_file) does not hold it yet: until it does, no moved password works",
        "warning: matrix-synapse-ldap3 is configured in Synapse, but this server's user store is 'file': directory "
        'users can log in here only with [backend] type = "ldap" (or a password in this store)',
        "warning: Synapse checks passwords through rest_auth_provider.RestAuthProvider (password_providers): "
        "passwords only they know are not carried",
        "warning: Synapse's config sets user_consent, login_via_existing_session, enable_3pid_changes, "
        "session_lifetime, which it refuses to start with under delegation: remove them at the switch",
    ]
    assert "a-secret-pepper" not in " ".join(lines)
    # With the pepper here, the warning only says to keep it.
    same = await run_check(make_config({"auth": {"synapse_pepper": "a-secret-pepper"}}), path)
    [pepper] = [line for line in same.lines() if "pepper" in line]
    assert pepper.endswith("must stay secret and unchanged")


# -- warnings from the database, with counts -----------------------------------------------


def fill(rows) -> None:
    u = "@{}:localhost".format
    rows.users([
        {"name": u("alice"), "password_hash": HASH4},  # in our users file (tests/support/helpers.py)
        {"name": u("bob"), "password_hash": HASH4, "admin": True},  # in our users file too
        {"name": u("carol"), "password_hash": HASH12, "admin": True, "locked": True},
        {"name": u("dan"), "password_hash": HASH4},
        {"name": u("sso"), "password_hash": None},
        {"name": u("gone"), "deactivated": True},
        {"name": u("guest"), "is_guest": True},
        {"name": u("irc_1"), "appservice_id": "irc"},
        {"name": u("irc_2"), "appservice_id": "irc"},
        {"name": u("waiting"), "password_hash": HASH4, "approved": False},
        {"name": u("root"), "password_hash": HASH4, "admin": True},
    ])
    rows.devices([{"user_id": u(n), "device_id": "D"} for n in ("alice", "carol", "dan", "sso", "guest")])
    rows.access_tokens([
        {"user_id": u("alice"), "device_id": "D", "token": MACAROON},  # an older Synapse's
        {"user_id": u("carol"), "device_id": "D", "token": "syt_c", "valid_until_ms": NOW - 1},
        {"user_id": u("root"), "device_id": None, "token": "syt_p", "puppets_user_id": u("dan")},
        {"user_id": u("dan"), "device_id": "D", "token": synapse_made("dan")},
        {"user_id": u("dan"), "device_id": "NOPE", "token": "syt_n"},
        {"user_id": u("sso"), "device_id": "D", "token": "syt_s"},
        {"user_id": u("guest"), "device_id": "D", "token": "syt_g"},
    ])
    rows.refresh_tokens([
        {"id": 1, "user_id": u("dan"), "device_id": "D", "token": "syr_1", "next_token_id": 2},
        {"id": 2, "user_id": u("dan"), "device_id": "D", "token": "syr_2"},
        {"id": 3, "user_id": u("sso"), "device_id": "D", "token": "syr_3"},
        {"id": 4, "user_id": u("carol"), "device_id": "D", "token": "syr_4", "expiry_ts": NOW - 1},
    ])
    rows.access_tokens([{"user_id": u("dan"), "device_id": "D", "token": synapse_made("dan"), "refresh_token_id": 2,
                         "used": True}])
    rows.threepids([{"user_id": u("alice"), "address": "a@example.org"}, {"user_id": u("alice"), "address": "b@x.org"},
                    {"user_id": u("dan"), "medium": "msisdn", "address": "447700900000"}])
    rows.external_ids([("oidc-old", "1", u("sso")), ("saml", "2", u("dan")), ("oauth-delegated", "3", u("dan"))])
    rows.devices([{"user_id": u("nobody"), "device_id": "X"}])
    rows.commit()


async def test_counts_against_a_users_file(tmp_path, make_config, synapse_db):
    fill(synapse_db.rows)
    synapse_db.finish()
    config = make_config({"delegation": {**DELEGATION, "admins": ["root"]}})
    report = await run_check(config, synapse_yaml(tmp_path, synapse_db.section), now_ms=NOW)
    lines = assert_well_formed(report)
    assert report.ok
    assert lines == [
        "warning: 2 Synapse users are already in this server's file user store and keep its record, password "
        "included: alice, bob",
        "warning: 1 Synapse user has no password hash (made by single sign-on or a module: sso): they are not moved "
        "and their sessions are not carried until add-user gives them a password here",
        f"warning: 1 moved password hash costs more than this server's [auth] bcrypt_rounds ({TEST_ROUNDS}; theirs "
        "up to 12): their logins take longer until their password is set again",
        "warning: 1 user has several e-mail addresses at Synapse: the record here keeps one (the first added)",
        # Not moved: sso (no hash) and the guest; the rest are alice's and dan's (carried).
        "warning: 5 access tokens will not be carried: 1 expired, 1 of admins acting as users, 1 without a device, "
        "2 of users not moved",
        "warning: 3 refresh tokens will not be carried: 1 expired, 1 already used, 1 of users not moved",
        "warning: 1 live access token does not name its user (an older Synapse's macaroons): carried, each found by "
        "its digest (one lookup more at its first request after each of Synapse's two-minute caches)",
        "warning: 2 users belong to application services (irc: 2): Synapse keeps authenticating them with the "
        "services' tokens; they are not moved",
        "warning: 1 guest account in Synapse's database: not moved, their tokens stop working",
        "warning: 1 user still waits for an admin's approval at Synapse (waiting): not moved",
        "warning: 1 phone number (user_threepids, not e-mail) is not carried",
        "warning: 2 single sign-on links (oidc-old: 1 (no longer configured), saml: 1) are not carried: those users "
        "log in here with a password or the directory",
        "warning: 1 user carries links of an earlier Matrix Authentication Service (auth_provider oauth-delegated): "
        "not carried",
        "warning: 1 row of devices, tokens, addresses or profiles belongs to user IDs Synapse's users table lacks: "
        "ignored",
        # bob is in our users file, unmarked; carol comes with the move (her record marked admin); root is listed.
        "warning: 1 Synapse admin (bob) is in this server's file user store without its admin mark (\"admin\": "
        "true in the record) and not in [delegation] admins: they are Synapse admins no more after the switch",
        "summary: 0 errors, 15 warnings; 11 users (3 admins, 1 locked, 1 deactivated), 5 devices, 8 access tokens "
        "(5 live), 4 refresh tokens (2 live)",
    ]
    assert not any(secret in " ".join(lines) for secret in ("syt_", "syr_", "$2b$"))


async def test_users_matching_only_by_case_are_named(tmp_path, make_config, users_path, user_records, synapse_db):
    synapse_db.rows.users([{"name": "@alice:localhost", "password_hash": HASH4}])
    synapse_db.finish()
    user_records[0]["name"] = "Alice"
    Path(users_path).write_text(json.dumps({"users": user_records}))
    report = await run_check(make_config({"delegation": DELEGATION}), synapse_yaml(tmp_path, synapse_db.section))
    assert [str(w) for w in report.warnings] == [
        "warning: 1 Synapse user matches this server's file user store only by case (alice (Alice here)): they would "
        "log in here as other Matrix users and are not moved; the records renamed would match them"]


async def test_deactivated_users_still_in_the_store_are_named(tmp_path, make_config, synapse_db):
    synapse_db.rows.users([{"name": "@bob:localhost", "deactivated": True}, {"name": "@gone:localhost", "deactivated": True}])
    synapse_db.finish()
    report = await run_check(make_config({"delegation": DELEGATION}), synapse_yaml(tmp_path, synapse_db.section))
    assert [str(w) for w in report.warnings] == [
        "warning: 1 user deactivated at Synapse is in this server's file user store (bob): Synapse does not check "
        "deactivation for a token it introspects, so only this server keeps them out; the move records them "
        "deactivated here, or remove them from the store"]


async def test_synapse_admins_the_store_marks_admin_stay_admins(tmp_path, make_config, users_path, user_records,
                                                               synapse_db):
    synapse_db.rows.users([{"name": "@alice:localhost", "admin": True}, {"name": "@bob:localhost", "admin": True}])
    synapse_db.finish()
    path = synapse_yaml(tmp_path, synapse_db.section)
    report = await run_check(make_config({"delegation": DELEGATION}), path)
    assert [str(w) for w in report.warnings if "admin" in str(w)] == [
        "warning: 2 Synapse admins (alice, bob) are in this server's file user store without its admin mark "
        '("admin": true in the record) and not in [delegation] admins: they are Synapse admins no more after the switch']
    user_records[0]["admin"] = True
    Path(users_path).write_text(json.dumps({"users": user_records}))
    report = await run_check(make_config({"delegation": {**DELEGATION, "admins": ["bob"]}}), path)
    assert not [w for w in report.warnings if "admin" in str(w)]


async def test_a_hash_that_is_no_bcrypt_is_not_moved(tmp_path, make_config, synapse_db):
    # A hash an admin set through Synapse's admin API may be any scheme: the run leaves its user
    # (plan.place: "bad_hash"), so the check says so, and does not count it as a moved hash.
    synapse_db.rows.users([{"name": "@eve:localhost", "password_hash": "$argon2id$v=19$m=65536,t=3,p=4$c2FsdA$aGFzaA"}])
    synapse_db.rows.devices([{"user_id": "@eve:localhost", "device_id": "D"}])
    synapse_db.rows.access_tokens([{"user_id": "@eve:localhost", "device_id": "D", "token": synapse_made("eve")}])
    synapse_db.finish()
    report = await run_check(make_config({"delegation": DELEGATION}), synapse_yaml(tmp_path, synapse_db.section))
    assert [str(w) for w in report.warnings] == [
        "warning: 1 Synapse user has a password hash that is not bcrypt (eve): they are not moved and their "
        "sessions are not carried until add-user gives them a password here",
        "warning: 1 access token will not be carried: 1 of users not moved",
    ]
    assert report.survey is not None and report.survey.hashes == 0


async def test_password_login_off_at_synapse(tmp_path, make_config, synapse_db):
    synapse_db.rows.users([{"name": "@dan:localhost", "password_hash": HASH4}])
    synapse_db.finish()
    for settings, needle in (({"enabled": False}, "password login is off (password_config.enabled: false)"),
                             ({"enabled": "only_for_reauth"}, "(password_config.enabled: only_for_reauth)"),
                             ({"localdb_enabled": False}, "only through its modules")):
        path = synapse_yaml(tmp_path, synapse_db.section, password_config=settings)
        report = await run_check(make_config({"delegation": DELEGATION}), path)
        [warning] = report.warnings
        assert needle in str(warning) and "its 1 password hash" in str(warning)


# -- a real Synapse, a users file and the LDAP directory ----------------------------------------


def folder_digest(path: str) -> dict[str, str]:
    folder = os.path.dirname(path)
    return {name: hashlib.sha256(Path(folder, name).read_bytes()).hexdigest()
            for name in sorted(os.listdir(folder)) if os.path.isfile(os.path.join(folder, name))}


async def test_a_real_synapse_against_a_users_file(make_config, users_path, synapse_before):
    config = make_config({"delegation": DELEGATION})
    synapse_files = folder_digest(str(synapse_before.config_path))
    ours = Path(users_path).read_bytes()
    report = await run_check(config, str(synapse_before.config_path))
    lines = assert_well_formed(report)
    assert report.ok, lines
    assert "warning: 2 Synapse users are already in this server's file user store and keep its record, password " \
           "included: alice, bob" in lines
    assert f"warning: 1 Synapse user has no password hash (made by single sign-on or a module: {LDAP_USER}): they " \
           "are not moved and their sessions are not carried until add-user gives them a password here" in lines
    assert any(line.startswith("warning: matrix-synapse-ldap3 is configured in Synapse") for line in lines)
    assert any(line.startswith("warning: Synapse's passwords carry a pepper") for line in lines)
    [tokens] = [line for line in lines if "access token" in line and "not be carried" in line]
    assert tokens.startswith("warning: ") and "1 of admins acting as users" in tokens and "of users not moved" in tokens
    [refresh] = [line for line in lines if "refresh token" in line and "not be carried" in line]
    assert refresh == "warning: 1 refresh token will not be carried: 1 already used"
    assert lines[-1].startswith("summary: 0 errors, ") and "7 users (1 admin, 1 locked, 1 deactivated)" in lines[-1]
    assert PEPPER not in " ".join(lines)
    # The check wrote nothing: not our users file, not a byte beside Synapse's database.
    assert Path(users_path).read_bytes() == ours
    assert folder_digest(str(synapse_before.config_path)) == synapse_files


async def test_a_real_synapse_against_the_ldap_directory(make_config, synapse_before):
    slapd = synapse_before.slapd
    config = make_config({
        "delegation": DELEGATION,
        "backend": {"type": "ldap"},
        "backend.ldap": {"uri": slapd.uri, "base": "ou=people,dc=example,dc=org", "mode": "bind"},
    })
    report = await run_check(config, str(synapse_before.config_path))
    lines = assert_well_formed(report)
    assert report.ok, lines
    # carol, deactivated at Synapse, is still in the directory; root is Synapse's own admin,
    # not in it; alice, bob, dave and erin are there too, with hashes of Synapse's own that
    # stay unused.
    assert lines[:3] == [
        "warning: 1 user deactivated at Synapse is in this server's ldap user store (carol): Synapse does not "
        "check deactivation for a token it introspects, so only this server keeps them out; the move records "
        "them deactivated here, or remove them from the store",
        "warning: 1 Synapse user is not in the LDAP directory (root): they cannot log in here and their sessions "
        "are not carried",
        "warning: 4 users in the directory also have a Synapse password hash: with an LDAP store they log in with "
        "their directory password; Synapse's hashes are not imported",
    ]
    assert not any("pepper" in line or "ldap3" in line for line in lines)
