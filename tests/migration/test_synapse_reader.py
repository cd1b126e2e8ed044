"""Reading Synapse's tables (backends/synapse/database.py) on Synapse's own schema, made by the
pinned Synapse, on SQLite and on PostgreSQL (a private cluster): rows written as Synapse
stores them, read back with every state and every token's fate."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import sys
from pathlib import Path

import pytest

from backends.synapse.config import DatabaseSettings
from backends.synapse.database import INSTALL_DRIVER, SynapseDatabase, SynapseReadError
from backends.synapse.rows import TokenFate
from tests.support.synapse_schema import sqlite_rows

NOW = 1_800_000_000_000  # ms
HOUR = 3_600_000


def uid(name: str) -> str:
    return f"@{name}:localhost"


def fill(db) -> None:
    """Users in every state, devices, tokens of every fate, addresses, profiles."""
    rows = db.rows
    rows.users([
        {"name": uid("alice"), "password_hash": "$2b$04$" + "a" * 53, "admin": True},
        {"name": uid("bob"), "password_hash": "$2b$04$" + "b" * 53, "locked": True, "user_type": "bot"},
        {"name": uid("carol"), "deactivated": True},
        {"name": uid("guest1"), "is_guest": True},
        {"name": uid("bridge"), "appservice_id": "irc"},
        {"name": uid("pending"), "approved": False, "suspended": True, "shadow_banned": True},
    ])
    rows.devices([
        {"user_id": uid("alice"), "device_id": "PHONE", "display_name": "Alice's phone", "last_seen": 5, "ip": "10.0.0.1",
         "user_agent": "Element"},
        {"user_id": uid("alice"), "device_id": "LAPTOP"},
        {"user_id": uid("alice"), "device_id": "ed25519-key", "hidden": True},  # cross-signing keys, not a device
        {"user_id": uid("bob"), "device_id": "BOT"},
    ])
    rows.refresh_tokens([
        {"id": 100, "user_id": uid("alice"), "device_id": "PHONE", "token": "syr_live"},
        {"id": 101, "user_id": uid("alice"), "device_id": "PHONE", "token": "syr_expired", "expiry_ts": NOW - 1},
        {"id": 102, "user_id": uid("alice"), "device_id": "PHONE", "token": "syr_ultimate",
         "ultimate_session_expiry_ts": NOW - 1},
        # Rotated: 103 -> 104, whose access token was never used: 103 is still accepted.
        {"id": 104, "user_id": uid("alice"), "device_id": "LAPTOP", "token": "syr_next"},
        {"id": 103, "user_id": uid("alice"), "device_id": "LAPTOP", "token": "syr_superseded", "next_token_id": 104},
        # Rotated: 105 -> 106, whose access token was used: 105 is spent.
        {"id": 106, "user_id": uid("bob"), "device_id": "BOT", "token": "syr_bob_next"},
        {"id": 105, "user_id": uid("bob"), "device_id": "BOT", "token": "syr_spent", "next_token_id": 106},
        # Rotated twice: 107 -> 108 -> 109: 107 is spent.
        {"id": 109, "user_id": uid("bob"), "device_id": "BOT", "token": "syr_c"},
        {"id": 108, "user_id": uid("bob"), "device_id": "BOT", "token": "syr_b", "next_token_id": 109},
        {"id": 107, "user_id": uid("bob"), "device_id": "BOT", "token": "syr_a", "next_token_id": 108},
        {"id": 110, "user_id": uid("bob"), "device_id": "GONE", "token": "syr_gone"},
    ])
    rows.access_tokens([
        {"user_id": uid("alice"), "device_id": "PHONE", "token": "syt_live", "last_validated": 7},
        {"user_id": uid("alice"), "device_id": "PHONE", "token": "syt_refreshable", "valid_until_ms": NOW + HOUR,
         "refresh_token_id": 100},
        {"user_id": uid("alice"), "device_id": "PHONE", "token": "syt_expired", "valid_until_ms": NOW - 1},
        {"user_id": uid("alice"), "device_id": "LAPTOP", "token": "syt_puppet", "puppets_user_id": uid("bob")},
        {"user_id": uid("alice"), "device_id": None, "token": "syt_deviceless"},
        {"user_id": uid("alice"), "device_id": "ed25519-key", "token": "syt_hidden_device"},
        {"user_id": uid("alice"), "device_id": "LAPTOP", "token": "syt_next", "refresh_token_id": 104, "used": False},
        {"user_id": uid("bob"), "device_id": "BOT", "token": "syt_bob_next", "refresh_token_id": 106, "used": True},
        {"user_id": uid("bob"), "device_id": "GONE", "token": "syt_gone"},
    ])
    rows.threepids([
        {"user_id": uid("alice"), "address": "alice@example.org", "added_at": 2},
        {"user_id": uid("alice"), "medium": "msisdn", "address": "447700900000", "added_at": 1},
    ])
    rows.profiles([{"localpart": "alice", "full_user_id": uid("alice"), "displayname": "Alice"}])
    rows.external_ids([("oidc-keycloak", "sub-1", uid("alice")), ("oidc-keycloak", "sub-2", uid("bob")),
                       ("saml", "x", uid("bob"))])
    rows.commit()


def test_users_in_every_state(synapse_db):
    fill(synapse_db)
    with SynapseDatabase.open(synapse_db.settings) as db:
        assert db.schema_version >= 85
        users = {u.localpart: u for u in db.users()}
    assert list(users) == sorted(users)
    alice, bob = users["alice"], users["bob"]
    assert (alice.admin, alice.locked, alice.password_hash) == (True, False, "$2b$04$" + "a" * 53)
    assert (bob.admin, bob.locked, bob.user_type) == (False, True, "bot")
    assert users["carol"].deactivated and users["carol"].password_hash is None
    assert users["guest1"].is_guest and users["bridge"].appservice_id == "irc"
    pending = users["pending"]
    assert (pending.approved, pending.suspended, pending.shadow_banned) == (False, True, True)
    assert alice.approved and not alice.suspended  # NULL approved is approved, as Synapse has it
    assert "$2b$" not in repr(alice)


def test_devices_leave_out_hidden_rows(synapse_db):
    fill(synapse_db)
    with SynapseDatabase.open(synapse_db.settings) as db:
        devices = list(db.devices())
    assert [(d.user_id, d.device_id) for d in devices] == [
        (uid("alice"), "LAPTOP"), (uid("alice"), "PHONE"), (uid("bob"), "BOT")]
    phone = devices[1]
    assert (phone.display_name, phone.last_seen, phone.ip, phone.user_agent) == ("Alice's phone", 5, "10.0.0.1", "Element")


def test_each_access_tokens_fate(synapse_db):
    fill(synapse_db)
    with SynapseDatabase.open(synapse_db.settings) as db:
        fates = {t.token: t.fate(NOW) for t in db.access_tokens()}
    assert fates == {
        "syt_live": TokenFate.LIVE,
        "syt_refreshable": TokenFate.LIVE,
        "syt_expired": TokenFate.EXPIRED,
        "syt_puppet": TokenFate.IMPERSONATION,
        "syt_deviceless": TokenFate.NO_DEVICE,
        "syt_hidden_device": TokenFate.NO_DEVICE,
        "syt_next": TokenFate.LIVE,
        "syt_bob_next": TokenFate.LIVE,
        "syt_gone": TokenFate.NO_DEVICE,
    }


def test_each_refresh_tokens_fate_as_synapse_would_take_it(synapse_db):
    fill(synapse_db)
    with SynapseDatabase.open(synapse_db.settings) as db:
        tokens = {t.token: t for t in db.refresh_tokens()}
    assert {token: t.fate(NOW) for token, t in tokens.items()} == {
        "syr_live": TokenFate.LIVE,
        "syr_expired": TokenFate.EXPIRED,
        "syr_ultimate": TokenFate.EXPIRED,
        "syr_next": TokenFate.LIVE,
        "syr_superseded": TokenFate.SUPERSEDED,
        "syr_bob_next": TokenFate.LIVE,
        "syr_spent": TokenFate.SPENT,
        "syr_a": TokenFate.SPENT,
        "syr_b": TokenFate.SUPERSEDED,
        "syr_c": TokenFate.LIVE,
        "syr_gone": TokenFate.NO_DEVICE,
    }
    assert "syr_" not in repr(tokens["syr_live"])


def test_accounts_put_each_users_rows_together(synapse_db):
    fill(synapse_db)
    with SynapseDatabase.open(synapse_db.settings) as db:
        accounts = {a.user.localpart: a for a in db.accounts("localhost")}
        assert db.external_id_counts() == {"oidc-keycloak": 2, "saml": 1}
        assert db.count("users") == 6
    alice = accounts["alice"]
    assert [d.device_id for d in alice.devices] == ["LAPTOP", "PHONE"]
    assert len(alice.access_tokens) == 7 and len(alice.refresh_tokens) == 5
    assert alice.emails == ["alice@example.org"] and len(alice.threepids) == 2
    assert alice.profile is not None and alice.profile.display_name == "Alice"
    assert [len(accounts["bob"].access_tokens), len(accounts["bob"].refresh_tokens)] == [2, 6]
    assert accounts["carol"].devices == [] and accounts["carol"].profile is None


def test_the_merge_holds_for_names_that_sort_apart_as_localparts(synapse_db):
    """`a.b` sorts before `a` as a full ID (`.` < `:`) but after it as a localpart; upper case,
    non-ASCII and rows of users `users` lacks; in batches of two, so every stream refills."""
    names = ["a", "a.b", "a-b", "A", "a_", "z", "é", "ü.x", "b"]
    rows = synapse_db.rows
    rows.users([{"name": uid(n)} for n in names])
    rows.devices([{"user_id": uid(n), "device_id": f"D{i}", "display_name": n} for i, n in enumerate(names)]
                 + [{"user_id": uid("ghost"), "device_id": "X"}, {"user_id": uid("0ghost"), "device_id": "Y"}])
    rows.access_tokens([{"user_id": uid(n), "device_id": f"D{i}", "token": f"syt_{i}"} for i, n in enumerate(names)])
    rows.profiles([{"localpart": n, "full_user_id": uid(n), "displayname": n.upper()} for n in names])
    rows.threepids([{"user_id": uid(n), "address": f"{i}@example.org"} for i, n in enumerate(names)])
    rows.commit()
    with SynapseDatabase.open(synapse_db.settings, batch_size=2) as db:
        accounts = list(db.accounts("localhost"))
        assert db.orphans == 2
    assert [a.user.user_id for a in accounts] == sorted(uid(n) for n in names)
    for account in accounts:
        name = account.user.localpart
        assert [d.display_name for d in account.devices] == [name]
        assert len(account.access_tokens) == 1 and account.access_tokens[0].device_id == account.devices[0].device_id
        assert account.profile is not None and account.profile.display_name == name.upper()
        assert len(account.emails) == 1


def test_old_profile_rows_without_a_full_user_id(synapse_schema_sqlite, tmp_path):
    """Rows from before profiles.full_user_id (Synapse's PostgreSQL schema refuses new ones)."""
    path = tmp_path / "homeserver.db"
    path.write_bytes(synapse_schema_sqlite.read_bytes())
    rows = sqlite_rows(path)
    rows.users([{"name": uid("old")}])
    rows.profiles([{"localpart": "old", "full_user_id": None, "displayname": "Old"}])
    rows.commit()
    rows.conn.close()
    with SynapseDatabase.open(DatabaseSettings("sqlite3", sqlite_path=str(path))) as db:
        [account] = db.accounts("localhost")
    assert account.profile is not None and account.profile.display_name == "Old"


def test_one_snapshot_for_every_read(synapse_db):
    synapse_db.rows.users([{"name": uid("first")}])
    synapse_db.rows.commit()
    with SynapseDatabase.open(synapse_db.settings) as db:
        assert [u.localpart for u in db.users()] == ["first"]
        synapse_db.rows.users([{"name": uid("second")}])
        synapse_db.rows.devices([{"user_id": uid("first"), "device_id": "LATE"}])
        synapse_db.rows.commit()
        assert [u.localpart for u in db.users()] == ["first"]
        assert list(db.devices()) == []


def digest(path) -> dict[str, str]:
    folder = os.path.dirname(path)
    return {name: hashlib.sha256(Path(folder, name).read_bytes()).hexdigest() for name in sorted(os.listdir(folder))}


def test_reading_a_stopped_synapses_sqlite_leaves_its_folder_as_it_was(synapse_schema_sqlite, tmp_path):
    """A read-only connection to a WAL database would leave -wal and -shm files (owned by
    whoever ran the check) beside Synapse's database: none is made, nothing changes."""
    path = tmp_path / "homeserver.db"
    path.write_bytes(synapse_schema_sqlite.read_bytes())
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO users (name) VALUES ('@x:localhost')")
    conn.close()
    before = digest(path)
    assert not any(name.endswith(("-wal", "-shm")) for name in before)
    with SynapseDatabase.open(DatabaseSettings("sqlite3", sqlite_path=str(path))) as db:
        assert [u.user_id for u in db.users()] == ["@x:localhost"]
    assert digest(path) == before


def test_a_running_synapses_sqlite_is_read_through_its_write_ahead_log(synapse_schema_sqlite, tmp_path):
    path = tmp_path / "homeserver.db"
    path.write_bytes(synapse_schema_sqlite.read_bytes())
    writer = sqlite3.connect(path)  # holds the log open, as a running Synapse does
    writer.execute("INSERT INTO users (name) VALUES ('@x:localhost')")
    writer.commit()
    assert os.path.getsize(f"{path}-wal") > 0
    with SynapseDatabase.open(DatabaseSettings("sqlite3", sqlite_path=str(path))) as db:
        assert [u.user_id for u in db.users()] == ["@x:localhost"]
    os.rename(f"{path}-shm", f"{path}-shm.away")  # a crash that lost it
    with pytest.raises(SynapseReadError, match="did not stop cleanly"):
        SynapseDatabase.open(DatabaseSettings("sqlite3", sqlite_path=str(path)))
    writer.close()


@pytest.mark.parametrize(("content", "problem"), [
    (None, "no such file"),
    (b"", "is not a Synapse database (it has no schema_version table)"),
    (b"not a database at all" * 100, "file is not a database"),
])
def test_sqlite_files_it_cannot_read(tmp_path, content, problem):
    path = tmp_path / "homeserver.db"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(SynapseReadError) as caught:
        SynapseDatabase.open(DatabaseSettings("sqlite3", sqlite_path=str(path)))
    assert problem in str(caught.value) and "\n" not in str(caught.value)


def test_a_schema_too_old(synapse_db):
    cursor = synapse_db.rows.conn.cursor()
    cursor.execute("UPDATE schema_version SET version = 80")
    synapse_db.rows.commit()
    with pytest.raises(SynapseReadError, match="schema 80; reading it needs schema 85 or newer"):
        SynapseDatabase.open(synapse_db.settings)


def test_postgres_it_cannot_reach_names_the_database_not_the_password(postgres_cluster):
    settings = DatabaseSettings("psycopg2", postgres={
        "host": "127.0.0.1", "port": str(postgres_cluster.port), "user": "postgres", "password": "s3cret-pw",
        "dbname": "no_such_database"})
    with pytest.raises(SynapseReadError) as caught:
        SynapseDatabase.open(settings)
    message = str(caught.value)
    assert message.startswith("cannot connect to the PostgreSQL database no_such_database on 127.0.0.1 port")
    assert 'database "no_such_database" does not exist' in message
    assert "s3cret" not in message and "\n" not in message
    postgres_cluster.create_database("not_synapse")
    settings = DatabaseSettings("psycopg2", postgres={**settings.postgres, "dbname": "not_synapse"})
    with pytest.raises(SynapseReadError, match="is not a Synapse database"):
        SynapseDatabase.open(settings)


def test_postgres_without_the_driver_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg raises ImportError
    with pytest.raises(SynapseReadError) as caught:
        SynapseDatabase.open(DatabaseSettings("psycopg2", postgres={"dbname": "synapse"}))
    assert str(caught.value) == INSTALL_DRIVER
    assert "pip install --require-hashes -r constraints-migrate.txt" in INSTALL_DRIVER


def test_a_malformed_dsn_is_said_without_its_text():
    """libpq's parse error quotes the connection string, and a DSN may hold the password."""
    settings = DatabaseSettings("psycopg2", dsn="host=db password='s3cret-pw", postgres={"dbname": "synapse"})
    with pytest.raises(SynapseReadError) as caught:
        SynapseDatabase.open(settings)
    message = str(caught.value)
    assert message.endswith("its dsn is not a valid connection string"), message
    assert "s3cret" not in message and "\n" not in message
