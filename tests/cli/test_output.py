"""What commands say and when they take effect on a running server: `run.py lock` at the
server's next request, `sessions revoke` as one sentence at a terminal with its audit line
in the system log only."""

from __future__ import annotations

import json
import os
import pty
import socket
import subprocess
import sys
import time

from backends.file import FRESHNESS
from tests.support.helpers import DEFAULT_USERS, JWT_SECRET
from tests.support.servers import LOGIN, ROOT, WHOAMI, Server, call, run_py

LOCKED = {"errcode": "M_USER_LOCKED", "error": "User account has been locked", "soft_logout": True}


def polling_config(tmp_path, reload_interval: float = 60.0) -> str:
    """The test users in a users file polled only every `reload_interval` seconds."""
    (tmp_path / "users.json").write_text(json.dumps({"users": DEFAULT_USERS}))
    path = tmp_path / "homeserver.toml"
    path.write_text(
        f'[auth]\njwt_secret = "{JWT_SECRET}"\n[backend.file]\npath = "users.json"\n'
        f'reload_interval = {reload_interval}\n[rate_limit]\nenabled = false\n[logging]\nlevel = "WARNING"\n'
    )
    return str(path)


def login_token(port: int) -> str:
    body = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": "alice"}, "password": "wonderland"}
    status, answer = call(port, LOGIN, body)
    assert status == 200, answer
    return str(answer["access_token"])


def test_lock_takes_effect_at_the_next_request_not_the_next_poll(tmp_path):
    conf = polling_config(tmp_path)  # a poll a minute: only the lookup's own check can see the lock
    server = Server("--config", conf)
    try:
        token = login_token(server.port)
        checked = time.monotonic()  # the login's lookup checked the file
        done = run_py("lock", "alice", "--config", conf)
        assert (done.returncode, done.stdout) == (0, "locked @alice:localhost\n"), done.stderr
        # The promise is the next request once FRESHNESS has passed since the last check (a
        # command can finish sooner on a fast machine): still far from the next poll.
        time.sleep(max(0.0, checked + FRESHNESS - time.monotonic()))
        assert call(server.port, WHOAMI, token=token) == (401, LOCKED)
        checked = time.monotonic()
        done = run_py("unlock", "alice", "--config", conf)
        assert done.returncode == 0, done.stderr
        time.sleep(max(0.0, checked + FRESHNESS - time.monotonic()))
        assert call(server.port, WHOAMI, token=token) == (200, {"user_id": "@alice:localhost", "device_id": "DUMMY"})
    finally:
        server.stop()


def run_at_a_terminal(syslog: str, *argv: str) -> tuple[int, str, str]:
    """`run.py` with standard error on a terminal (a pty) and the system log at `syslog`;
    (exit status, standard output, what the terminal showed)."""
    code = (
        "import sys; import homeserver.logs as logs; logs.SYSLOG_SOCKET = sys.argv[1]; "
        "from homeserver.cli import main; sys.exit(main(sys.argv[2:]))"
    )
    leader, follower = pty.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, syslog, *argv], cwd=ROOT, stdout=subprocess.PIPE, stderr=follower,
            stdin=subprocess.DEVNULL, text=True, timeout=60,
        )
        os.close(follower)
        follower = -1
        shown = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: the terminal has no writer left
                break
            if not chunk:
                break
            shown += chunk
    finally:
        if follower >= 0:
            os.close(follower)
        os.close(leader)
    return proc.returncode, proc.stdout, shown.decode(errors="replace")


def test_revoke_at_a_terminal_says_one_sentence_and_logs_the_audit_line_only(tmp_path):
    conf = polling_config(tmp_path, reload_interval=0)
    server = Server("--config", conf)
    syslog = str(tmp_path / "log.sock")
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(syslog)
    receiver.settimeout(10)
    try:
        login_token(server.port)
        login_token(server.port)
        code, out, shown = run_at_a_terminal(syslog, "sessions", "revoke", "alice", "--all", "--config", conf)
        assert (code, out, shown) == (0, "Ended 2 sessions of @alice:localhost.\n", "")
        line = receiver.recv(4096).decode()
        assert line.startswith("<86>homeserver: audit revoke user=\"alice\" client=\"cli\"") and "count=2" in line, line
        code, out, shown = run_at_a_terminal(syslog, "sessions", "revoke", "alice", "--all", "--config", conf)
        assert (code, out) == (0, "No session of @alice:localhost was open: nothing ended.\n")
    finally:
        receiver.close()
        server.stop()


def test_revoke_at_a_terminal_without_a_system_log_shows_no_traceback(tmp_path):
    """No `/dev/log` (a container, a minimal system): the audit line goes to standard error,
    one line, where a FileNotFoundError and logging's traceback used to follow the result."""
    conf = polling_config(tmp_path, reload_interval=0)
    server = Server("--config", conf)
    try:
        login_token(server.port)
        code, out, shown = run_at_a_terminal(str(tmp_path / "no-such-log"), "sessions", "revoke", "alice", "--all",
                                             "--config", conf)
        assert (code, out) == (0, "Ended 1 session of @alice:localhost.\n"), shown
        assert "Traceback" not in shown and "Error" not in shown, shown
        lines = shown.splitlines()
        assert len(lines) == 1 and 'audit revoke user="alice"' in lines[0] and "count=1" in lines[0], shown
    finally:
        server.stop()


def test_a_system_log_gone_while_running_falls_back_quietly(tmp_path, capsys):
    """The daemon stops between the command's start and its audit line: the line goes where
    the command's other lines go (standard error), not a traceback."""
    import logging

    import homeserver.logs as logs

    path = str(tmp_path / "log.sock")
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(path)
    old = logs.SYSLOG_SOCKET
    logs.SYSLOG_SOCKET = path
    root = logging.getLogger()
    kept = root.handlers[:]
    try:
        handler = logs._system_log("text")
        assert handler is not None
        receiver.close()
        os.unlink(path)
        stream = logging.StreamHandler(sys.stderr)  # capsys's
        root.handlers[:] = [stream]
        record = logging.LogRecord("homeserver.audit", logging.INFO, __file__, 1, 'audit lock user="bob"', None, None)
        handler.handle(record)
        handler.close()
    finally:
        logs.SYSLOG_SOCKET = old
        root.handlers[:] = kept
    err = capsys.readouterr().err
    assert 'audit lock user="bob"' in err and "Traceback" not in err, err
