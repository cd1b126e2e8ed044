"""`run.py sessions adopt`: moving to another user store keeps the sessions of the users
found in both (a second users file whose records differ, as LDAP's entries would)."""

from __future__ import annotations

import json

from tests.support.helpers import JWT_SECRET, record
from tests.support.servers import LOGIN, WHOAMI, Server, call, run_py

OLD_USERS = [record("alice", "wonderland", " [alice]"), record("bob", "builder", " [bob]")]
# Another store: alice's record is another one (another hash of the same password, another
# ident), so every fingerprint differs; bob is not there.
NEW_USERS = [record("alice", "wonderland", " (Alice, Sales)"), record("carol", "secret", " [carol]")]


def config(tmp_path, name: str, users: list[dict]) -> str:
    (tmp_path / f"{name}.json").write_text(json.dumps({"users": users}))
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'[auth]\njwt_secret = "{JWT_SECRET}"\n[backend.file]\npath = "{name}.json"\n'
        '[rate_limit]\nenabled = false\n[logging]\nlevel = "WARNING"\n'
    )
    return str(path)


def token(port: int, user: str, password: str) -> str:
    body = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user}, "password": password}
    status, answer = call(port, LOGIN, body)
    assert status == 200, answer
    return str(answer["access_token"])


def test_adopt_carries_the_sessions_of_users_in_both_stores(tmp_path):
    old, new = config(tmp_path, "old", OLD_USERS), config(tmp_path, "new", NEW_USERS)
    server = Server("--config", old)
    try:
        alice = [token(server.port, "alice", "wonderland") for _ in range(2)]
        bob = token(server.port, "bob", "builder")
    finally:
        server.stop()

    dry = run_py("sessions", "adopt", "--from", old, "--config", new)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == [
        f"Would carry (a dry run) the sessions in the store of {new} over to its user store (file), "
        f"from that of {old} (file):",
        "  @alice:localhost: 2 sessions to carry over",
        "  @bob:localhost: not in the new user store: 1 session not carried (they end at their next use)",
        "Nothing was changed. With --yes, 2 sessions of 1 user are carried over. Not carried (not in the new "
        "user store): @bob:localhost. Stop the server first: one still on the old user store ends each carried "
        "session at its next use.",
    ]
    done = run_py("sessions", "adopt", "--from", old, "--config", new, "--yes")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1:] == [
        "  @alice:localhost: 2 sessions carried over",
        "  @bob:localhost: not in the new user store: 1 session not carried (they end at their next use)",
        "Carried 2 sessions of 1 user over to the new user store. Not carried (not in the new user store): "
        "@bob:localhost.",
    ]
    again = run_py("sessions", "adopt", "--from", old, "--config", new, "--yes")
    assert "  @alice:localhost: its sessions belong to the new user store already" in again.stdout.splitlines()

    server = Server("--config", new)
    try:
        for each in alice:
            assert call(server.port, WHOAMI, token=each) == (200, {"user_id": "@alice:localhost", "device_id": "DUMMY"})
        status, body = call(server.port, WHOAMI, token=bob)
        assert (status, body["errcode"], body["soft_logout"]) == (401, "M_UNKNOWN_TOKEN", False)
    finally:
        server.stop()


def test_adopt_needs_a_server_to_have_run(tmp_path):
    old, new = config(tmp_path, "old", OLD_USERS), config(tmp_path, "new", NEW_USERS)
    done = run_py("sessions", "adopt", "--from", old, "--config", new)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "does not exist" in done.stderr, done.stderr
