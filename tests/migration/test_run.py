"""`run.py migrate-synapse run` (and `check`) as an operator runs them, on what a real Synapse made
itself (tests/support/synapse_before.py), SQLite and PostgreSQL, into a users file and this
server's SQLite session store: the dry run writes nothing, the run carries every live token with
its user and device, a second run adds nothing, and the moved users and tokens work here."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from homeserver.config import load_config
from homeserver.context import build_homeserver, create_session_store
from homeserver.errors import MatrixError
from tests.support.helpers import JWT_SECRET, record
from tests.support.servers import ROOT
from tests.support.synapse_before import LDAP_USER, PASSWORDS, PEPPER


def write_config(folder: Path, users: list[dict[str, Any]], extra: str = "") -> Path:
    """This server's config: a users file, the SQLite session store, Synapse's pepper; a store
    made as a server's first start makes it (the commands work on a server that has run)."""
    (folder / "users.json").write_text(json.dumps({"users": users}))
    path = folder / "homeserver.toml"
    path.write_text(
        f'[server]\nserver_name = "localhost"\n[auth]\njwt_secret = "{JWT_SECRET}"\nbcrypt_rounds = 4\n'
        f'synapse_pepper = "{PEPPER}"\n[backend.file]\npath = "users.json"\n[rate_limit]\nenabled = false\n'
        f'[logging]\nlevel = "WARNING"\n{extra}'
    )
    config = load_config(str(path))

    async def make_store() -> None:
        store = create_session_store(config)
        await store.start()
        await store.close()

    asyncio.run(make_store())
    return path


def migrate(config: Path, synapse_config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "run.py", "migrate-synapse", *args, "--synapse-config", str(synapse_config),
         "--config", str(config)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )


MOVED = ("root", "alice", "bob", "dave", "erin")


def live_access_tokens(before, names: tuple[str, ...]) -> int:
    """The live access tokens of these users in Synapse's database now."""
    import time

    from backends.synapse.config import load_synapse_config
    from backends.synapse.database import SynapseDatabase
    from backends.synapse.rows import TokenFate

    config = load_synapse_config(str(before.config_path))
    assert config.database is not None
    now = int(time.time() * 1000)
    with SynapseDatabase.open(config.database) as db:
        return sum(t.fate(now) is TokenFate.LIVE for a in db.accounts(config.server_name)
                   if a.user.localpart in names for t in a.access_tokens)


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def line(output: str, prefix: str) -> str:
    [found] = [x for x in output.splitlines() if x.startswith(prefix)]
    return found


@pytest.fixture
def ours(tmp_path) -> Path:
    """A server that has run, whose users file already has a bob of its own (his record is kept)."""
    return write_config(tmp_path, [record("bob", "bobs-own-password", "-bob")])


async def hs_of(config_path: Path):
    config = load_config(str(config_path))
    hs = build_homeserver(config)
    await hs.backend.start()
    await hs.sessions.store.start()
    return hs


async def close(hs) -> None:
    await hs.close()


def test_dry_run_then_run_then_run_again(ours, synapse_before, tmp_path):
    synapse_config = synapse_before.config_path
    state = synapse_before.state
    before = digests(tmp_path)
    dry = migrate(ours, synapse_config, "run", "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert digests(tmp_path) == before, "the dry run wrote something"
    assert line(dry.stdout, "summary:").startswith("summary: dry run, nothing written")
    assert line(dry.stdout, "users:") == ("users: 5 users would be moved (4 added to the file user store, "
                                          "1 already there, keeping their records) of 7 read")

    most = live_access_tokens(synapse_before, MOVED)
    done = migrate(ours, synapse_config, "run")
    least = live_access_tokens(synapse_before, MOVED)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert PEPPER not in out and all(s.access_token not in out for s in state.sessions.values())
    assert line(out, "users:") == ("users: 5 users moved (4 added to the file user store, 1 already there, "
                                   "keeping their records) of 7 read")
    assert line(out, "deactivated at Synapse:").startswith("deactivated at Synapse: 1 user recorded here")
    # Every live one (their registrations' and logins'; refreshable ones may expire meanwhile).
    carried = int(line(out, "access tokens:").split()[2])
    assert least <= carried <= most and least >= len(state.sessions) - 1
    # Alice's laptop and erin's phone: one each; erin's tablet: its current and the superseded one.
    assert line(out, "refresh tokens:") == "refresh tokens: 4 carried"
    assert line(dry.stdout, "access tokens:").endswith("would be carried as sessions")
    assert line(out, "carried by an earlier run already:").endswith(": 0 tokens or devices")

    users = {r["name"]: r for r in json.loads((tmp_path / "users.json").read_text())["users"]}
    assert set(users) == {"bob", "root", "alice", "dave", "erin"}
    assert users["bob"] == record("bob", "bobs-own-password", "-bob")  # his own record, kept
    assert users["alice"]["password_scheme"] == "synapse" and users["alice"]["display_name"] == "Alice Liddell"
    assert users["root"].get("admin") is True and users["dave"].get("locked") is True
    assert "admin" not in users["alice"] and "locked" not in users["alice"]

    again = migrate(ours, synapse_config, "run")
    assert again.returncode == 0, again.stdout + again.stderr
    assert line(again.stdout, "users:") == ("users: 5 users moved (0 added to the file user store, 5 already "
                                            "there, keeping their records) of 7 read")
    assert line(again.stdout, "access tokens:") == "access tokens: 0 carried as sessions"
    assert line(again.stdout, "refresh tokens:") == "refresh tokens: 0 carried"
    assert "carried by an earlier run already: 0" not in again.stdout
    assert json.loads((tmp_path / "users.json").read_text())["users"] == list(users.values())

    asyncio.run(_after_the_move(ours, synapse_before.state))


async def _after_the_move(config_path: Path, state) -> None:
    hs = await hs_of(config_path)
    try:
        for name, session in state.sessions.items():
            if name == LDAP_USER:
                continue
            if name == "dave":
                with pytest.raises(MatrixError) as locked:
                    await hs.auth.requester(session.access_token, "10.0.0.1")
                assert locked.value.errcode == "M_USER_LOCKED"
                continue
            requester = await hs.auth.requester(session.access_token, "10.0.0.1")
            assert (requester.user.name, requester.device_id) == (session.user, session.device_id), name
        # Moved passwords: Synapse's pepper and NFKC; carol, deactivated at Synapse, refused.
        for name in ("root", "alice", "erin"):
            assert await hs.login.authenticate(name, PASSWORDS[name], "10.0.0.1", reason="test")
        assert await hs.login.authenticate("alice", "fish and chips", "10.0.0.1", reason="test")
        assert await hs.sessions.store.imported().is_deactivated("carol")
        # The puppet and the logged-out tokens were not carried.
        for token in (state.puppet_token, state.logged_out_token):
            with pytest.raises(MatrixError):
                await hs.auth.requester(token, "10.0.0.1")
        devices = {d.device_id: d.display_name for d in await hs.sessions.store.devices("alice")}
        # Her two logins' devices by name, and the one Synapse's registration made.
        assert {"ALICEPHONE": "Alice's phone", "ALICELAPTOP": "Alice's laptop"}.items() <= devices.items()
        assert len(devices) == 3
    finally:
        await close(hs)


def test_check_exits_one_on_an_error_and_run_writes_nothing_then(tmp_path, synapse_before):
    config = write_config(tmp_path, [], extra="")
    text = config.read_text().replace('server_name = "localhost"', 'server_name = "example.org"')
    config.write_text(text)
    before = digests(tmp_path)
    checked = migrate(config, synapse_before.config_path, "check")
    assert checked.returncode == 1
    assert checked.stdout.splitlines()[0].startswith("error: Synapse's server_name is 'localhost'")
    ran = migrate(config, synapse_before.config_path, "run")
    assert ran.returncode == 1 and ran.stdout.splitlines() == [
        x for x in checked.stdout.splitlines() if x.startswith("error:")]
    assert digests(tmp_path) == before



def test_a_dry_run_refuses_a_session_file_of_an_older_version(tmp_path, synapse_before):
    import sqlite3

    from backends.sessions.sqlite.schema import VERSION
    from homeserver.cli.migrate import session_schema_version

    config = write_config(tmp_path, [])
    path = tmp_path / "sessions.db"
    assert session_schema_version(str(path)) == VERSION
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {VERSION - 1}")
    conn.close()
    before = digests(tmp_path)
    dry = migrate(config, synapse_before.config_path, "run", "--dry-run")
    assert dry.returncode == 1
    assert line(dry.stdout, "error:").startswith("error: this server's stores: sessions.sqlite.path: ")
    assert "older version of this server: start this version once" in dry.stdout
    assert digests(tmp_path) == before
