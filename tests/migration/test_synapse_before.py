"""The reader on what a real Synapse made itself (tests/support/synapse_before.py), on SQLite
and on PostgreSQL, with matrix-synapse-ldap3 on the test slapd: every user's state, every
session's token and device, refresh tokens after real refreshes, passwords checkable here,
and Synapse still working on its database after it was read."""

from __future__ import annotations

import time

from backends.synapse.config import load_synapse_config
from backends.synapse.database import SynapseDatabase
from backends.synapse.rows import SynapseAccount, TokenFate
from homeserver.synapse_passwords import check_synapse_password
from tests.support.synapse_before import LDAP_USER, PASSWORDS


def read(before) -> tuple[dict[str, SynapseAccount], int]:
    config = load_synapse_config(str(before.config_path))
    assert config.database is not None, config.database_problem
    with SynapseDatabase.open(config.database) as db:
        accounts = {a.user.localpart: a for a in db.accounts(config.server_name)}
        return accounts, db.orphans


def now_ms() -> int:
    return int(time.time() * 1000)


def test_the_config_it_was_started_with(synapse_before):
    config = load_synapse_config(str(synapse_before.config_path))
    assert (config.server_name, config.pepper, config.bcrypt_rounds, config.ldap3) == (
        "localhost", synapse_before.state.pepper, 4, True)
    assert config.database is not None
    assert config.database.engine == ("psycopg2" if synapse_before.kind == "postgres" else "sqlite3")
    if synapse_before.kind == "postgres":
        assert not any(key.startswith("cp_") for key in config.database.postgres)


def test_users_and_their_states(synapse_before):
    accounts, orphans = read(synapse_before)
    assert orphans == 0
    assert set(accounts) == {"root", "alice", "bob", "carol", "dave", "erin", LDAP_USER}
    users = {name: account.user for name, account in accounts.items()}
    assert [name for name, user in users.items() if user.admin] == ["root"]
    assert [name for name, user in users.items() if user.locked] == ["dave"]
    assert [name for name, user in users.items() if user.deactivated] == ["carol"]
    # Deactivation removed carol's hash, devices and tokens; the lock kept dave's.
    carol, dave = accounts["carol"], accounts["dave"]
    assert carol.user.password_hash is None and carol.devices == [] and carol.access_tokens == []
    assert [d.device_id for d in dave.devices if d.device_id == "DAVEPHONE"] and dave.access_tokens
    # matrix-synapse-ldap3 made grace without a password: the directory keeps it.
    assert users[LDAP_USER].password_hash is None
    assert {d.display_name for d in accounts[LDAP_USER].devices} >= {"Grace's phone"}


def test_synapse_password_hashes_check_here_with_its_pepper_and_nfkc(synapse_before):
    accounts, _ = read(synapse_before)
    pepper = synapse_before.state.pepper
    for name in ("root", "alice", "bob", "dave", "erin"):
        hashed = accounts[name].user.password_hash
        assert hashed is not None and hashed.startswith("$2b$04$")
        assert check_synapse_password(PASSWORDS[name], hashed, pepper), name
        assert not check_synapse_password(PASSWORDS[name], hashed, ""), name
        assert not check_synapse_password(PASSWORDS[name] + "x", hashed, pepper), name
    # alice's password is "ﬁsh and chips"; she logged in at Synapse as "fish and chips" too.
    assert check_synapse_password("fish and chips", accounts["alice"].user.password_hash or "", pepper)


def test_every_session_is_a_live_token_on_its_device(synapse_before):
    accounts, _ = read(synapse_before)
    now = now_ms()
    tokens = {t.token: t for a in accounts.values() for t in a.access_tokens}
    for name, session in synapse_before.state.sessions.items():
        token = tokens[session.access_token]
        assert (token.user_id, token.device_id) == (f"@{session.user}:localhost", session.device_id), name
        assert token.fate(now) is TokenFate.LIVE, name
    alice = accounts["alice"]
    assert {d.device_id: d.display_name for d in alice.devices if d.device_id.startswith("ALICE")} == {
        "ALICEPHONE": "Alice's phone", "ALICELAPTOP": "Alice's laptop"}
    # The laptop's token expires (it came with a refresh token); Synapse's default five minutes.
    laptop = tokens[synapse_before.state.sessions["alice_laptop"].access_token]
    assert laptop.valid_until_ms is not None and laptop.refresh_token_id is not None
    assert laptop.fate(laptop.valid_until_ms + 1) is TokenFate.EXPIRED
    assert synapse_before.state.logged_out_token not in tokens


def test_impersonation_is_told_apart(synapse_before):
    accounts, _ = read(synapse_before)
    # Synapse keeps it as the admin's token (no device) naming the user it acts as.
    [puppet] = [t for t in accounts["root"].access_tokens if t.token == synapse_before.state.puppet_token]
    assert (puppet.puppets_user_id, puppet.device_id) == ("@bob:localhost", None)
    assert puppet.fate(now_ms()) is TokenFate.IMPERSONATION


def test_refresh_tokens_after_real_refreshes(synapse_before):
    accounts, _ = read(synapse_before)
    state, now = synapse_before.state, now_ms()
    fates = {t.token: t.fate(now) for t in accounts["erin"].refresh_tokens}
    assert fates == {
        state.spent_refresh: TokenFate.SPENT,
        state.sessions["erin_phone"].refresh_token: TokenFate.LIVE,
        state.superseded_refresh: TokenFate.SUPERSEDED,
        state.sessions["erin_tablet"].refresh_token: TokenFate.LIVE,
    }
    [laptop] = accounts["alice"].refresh_tokens
    assert laptop.token == state.sessions["alice_laptop"].refresh_token and laptop.fate(now) is TokenFate.LIVE
    assert laptop.device_id == "ALICELAPTOP"


def test_profiles_and_addresses(synapse_before):
    accounts, _ = read(synapse_before)
    assert accounts["alice"].profile is not None and accounts["alice"].profile.display_name == "Alice Liddell"
    assert accounts["bob"].emails == ["bob@example.org"]


def test_synapse_runs_on_as_before_after_being_read(synapse_before):
    """Reading changed nothing Synapse needs: started again, it takes its tokens as before
    (and refuses the one logged out)."""
    read(synapse_before)
    synapse = synapse_before.synapse
    synapse.start()
    try:
        for name, session in synapse_before.state.sessions.items():
            status, answer = synapse.whoami(session.access_token)
            if name == "dave":
                assert status == 401 and answer["errcode"] == "M_USER_LOCKED"
            else:
                assert status == 200 and answer["device_id"] == session.device_id, (name, answer)
        assert synapse.whoami(synapse_before.state.logged_out_token)[0] == 401
    finally:
        synapse.stop()
