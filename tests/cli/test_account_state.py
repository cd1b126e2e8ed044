"""Account state from the command line and in a real server process: `run.py lock` / `unlock`,
`add-user --overwrite` and SIGHUP; credential fingerprints across a secret rotation; the
audit line's JSON form."""

from __future__ import annotations

import json
import logging
import signal

from backends.base import User
from backends.sessions.base import Session
from homeserver import audit
from homeserver.credentials import Credentials
from homeserver.logs import JsonFormatter
from homeserver.request_id import RequestIdFilter
from tests.support.helpers import JWT_SECRET
from tests.support.servers import LOGIN, WHOAMI, run_py

OLD_SECRET = "an-older-secret-of-at-least-32-bytes!!"


def login_body(user: str, password: str) -> dict:
    return {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user}, "password": password}


def test_lock_unlock_and_reset_with_the_cli_and_sighup(start, tmp_path):
    server = start()
    config = str(tmp_path / "homeserver.toml")
    status, body = server.request(LOGIN, login_body("alice", "wonderland"))
    assert status == 200
    token = body["access_token"]

    done = run_py("lock", "alice", "--config", config)
    assert (done.returncode, done.stdout) == (0, "locked @alice:localhost\n")
    assert json.loads(server.users.read_text())["users"][0]["locked"] is True
    server.proc.send_signal(signal.SIGHUP)
    server.wait_log("reloaded users file")
    assert server.request(WHOAMI, token=token) == (
        401, {"errcode": "M_USER_LOCKED", "error": "User account has been locked", "soft_logout": True}
    )

    done = run_py("unlock", "@alice:localhost", "--config", config)
    assert (done.returncode, done.stdout) == (0, "unlocked @alice:localhost\n")
    assert "locked" not in json.loads(server.users.read_text())["users"][0]
    server.proc.send_signal(signal.SIGHUP)
    server.wait_log_count("reloaded users file", 2)
    assert server.request(WHOAMI, token=token) == (200, {"user_id": "@alice:localhost", "device_id": "DUMMY"})

    # A reset with add-user --overwrite ends the session opened with the old password.
    done = run_py("add-user", "alice", "--overwrite", "--rounds", "4", "--config", config, stdin="new-password\n")
    assert done.returncode == 0, done.stderr
    server.proc.send_signal(signal.SIGHUP)
    server.wait_log_count("reloaded users file", 3)
    status, body = server.request(WHOAMI, token=token)
    assert (status, body["errcode"], body["soft_logout"]) == (401, "M_UNKNOWN_TOKEN", False)
    assert server.request(LOGIN, login_body("alice", "new-password"))[0] == 200

    # `sessions revoke` writes its audit line where the server's log goes.
    done = run_py("sessions", "revoke", "alice", "--all", "--config", config)
    assert done.returncode == 0, done.stderr
    assert 'audit revoke user="alice" client="cli" reason="revoked" count=1' in done.stderr, done.stderr


def test_lock_of_an_unknown_user_is_one_line_and_exit_1(conf):
    for verb in ("lock", "unlock"):
        done = run_py(verb, "nobody", "--config", str(conf))
        assert done.returncode == 1
        assert done.stderr.count("\n") == 1 and "unknown user 'nobody'" in done.stderr


def test_lock_keeps_the_lock_through_add_user_overwrite(conf, tmp_path):
    assert run_py("add-user", "carol", "--ident", "c", "--config", str(conf), stdin="pw\n").returncode == 0
    assert run_py("lock", "carol", "--config", str(conf)).returncode == 0
    assert run_py("add-user", "carol", "--overwrite", "--config", str(conf), stdin="pw2\n").returncode == 0
    [carol] = json.loads((tmp_path / "users.json").read_text())["users"]
    assert carol["locked"] is True  # a reset does not unlock


def test_ldap_lock_names_the_directory_tools(tmp_path):
    config = tmp_path / "ldap.toml"
    config.write_text('[backend]\ntype = "ldap"\n[backend.ldap]\nuri = "ldap://127.0.0.1:1"\nbase = "dc=x"\n')
    done = run_py("lock", "alice", "--config", str(config))
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1
    assert "pwdAccountLockedTime" in done.stderr and "nsAccountLock" in done.stderr and "disable" in done.stderr


# -- fingerprints -------------------------------------------------------------------------------


def session_with(fingerprints: Credentials, user: User) -> Session:
    fp = fingerprints.of(user)
    return Session("h", user.name, "D", 0, "", 0, identity_fp=fp.identity, password_fp=fp.password)


def test_fingerprints_hide_the_hash_and_survive_a_secret_rotation():
    alice = User(name="alice", ident="a", password="24326224" + "00" * 30)
    before = Credentials(OLD_SECRET)
    session = session_with(before, alice)
    assert alice.password not in (session.identity_fp, session.password_fp)
    assert len(session.identity_fp) == len(session.password_fp) == 32
    # After the rotation (the old secret in previous_jwt_secrets) the session still belongs.
    after = Credentials(JWT_SECRET, [OLD_SECRET])
    assert after.stale(session, alice) is None
    # Without the old secret it can no longer be told apart from another credential.
    assert Credentials(JWT_SECRET).stale(session, alice) is not None
    # Another key, other digests: the same credential looks different to another server.
    assert Credentials(JWT_SECRET).of(alice) != before.of(alice)


def test_directory_identity_and_password_are_separate():
    keys = Credentials(JWT_SECRET)
    lax = Credentials(JWT_SECRET, end_on_password_change=False)
    alice = User(name="alice", ident="a", uid="uuid-1", password_stamp="20260101000000Z")
    session = session_with(keys, alice)
    rotated = User(name="alice", ident="a", uid="uuid-1", password_stamp="20260401000000Z")
    assert keys.stale(session, rotated) == "password_changed"
    assert lax.stale(session, rotated) is None  # end_on_password_change = false
    readded = User(name="alice", ident="a", uid="uuid-2", password_stamp="20260101000000Z")
    assert keys.stale(session, readded) == lax.stale(session, readded) == "account_replaced"
    # The ident and the profile are no identity where the directory has one.
    renamed = User(name="alice", ident="b", display_name="A", uid="uuid-1", password_stamp="20260101000000Z")
    assert keys.stale(session, renamed) is None
    # Sessions opened before fingerprints were kept are never stale.
    assert keys.stale(Session("h", "alice", "D", 0, "", 0), readded) is None


def test_audit_line_in_json_has_its_fields():
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    handler.addFilter(RequestIdFilter())
    audit.logger.addHandler(handler)
    level = audit.logger.level
    audit.logger.setLevel(logging.INFO)
    try:
        audit.audit(audit.LOGIN, user="alice", device='PHONE"\n', client="10.0.0.1", outcome="success")
    finally:
        audit.logger.removeHandler(handler)
        audit.logger.setLevel(level)
    [record] = records
    line = JsonFormatter().format(record)
    entry = json.loads(line)
    assert "\n" not in line
    assert (entry["logger"], entry["event"], entry["user"], entry["device"], entry["client"], entry["outcome"]) == (
        "homeserver.audit", "login", "alice", 'PHONE"\n', "10.0.0.1", "success"
    )
    # The text form quotes client-chosen values, so a device ID cannot forge a line.
    assert record.getMessage() == 'audit login user="alice" outcome="success" device="PHONE\\"\\n" client="10.0.0.1"'
