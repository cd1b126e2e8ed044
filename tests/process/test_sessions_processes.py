"""Sessions across real processes: N workers on one SQLite store, kill -9, and the operator's CLI."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support.servers import WHOAMI, Server, call, login, run_py, write_config

LOGOUT = "/_matrix/client/v3/logout"


@pytest.fixture
def conf(tmp_path) -> str:
    """A config file on the file backend and the default SQLite session store, in tmp_path."""
    return write_config(tmp_path, "[rate_limit]\nenabled = false\n")


@pytest.fixture
def workers(conf) -> Iterator[Server]:
    server = Server("--config", conf, "--processes", "2")
    yield server
    server.stop()


def test_the_default_store_is_a_sqlite_file_beside_the_config(workers, conf):
    status, body = login(workers.port, "alice", "wonderland")
    assert status == 200, body
    assert os.path.exists(os.path.join(os.path.dirname(conf), "sessions.db"))


def on_both_workers(port: int, check) -> None:
    """Run `check` on fresh connections until both workers have answered one (their pids), then
    a few more. The server answers once its first worker serves: the second may still be
    starting, and on an idle machine one worker can take many connections in a row."""
    pids: set[int] = set()
    deadline = time.monotonic() + 30
    while len(pids) < 2:
        assert time.monotonic() < deadline, f"only workers {pids} answered"
        check()
        pids.add(call(port, "/health")[1]["pid"])
    for _ in range(10):
        check()


def test_every_worker_sees_one_logout_at_once(workers):
    status, body = login(workers.port, "alice", "wonderland")
    assert status == 200, body
    token = body["access_token"]

    def signed_in() -> None:
        assert call(workers.port, WHOAMI, token=token)[0] == 200

    on_both_workers(workers.port, signed_in)
    assert call(workers.port, LOGOUT, {}, token=token) == (200, {})

    def logged_out() -> None:
        status, body = call(workers.port, WHOAMI, token=token)
        assert (status, body["errcode"], body["soft_logout"]) == (401, "M_UNKNOWN_TOKEN", False)

    on_both_workers(workers.port, logged_out)


def test_the_cli_lists_and_revokes_on_a_running_server(workers, conf):
    phone = login(workers.port, "alice", "wonderland", device_id="PHONE", initial_device_display_name="Phone")[1]
    laptop = login(workers.port, "alice", "wonderland", device_id="LAPTOP")[1]
    listed = run_py("sessions", "list", "alice", "--config", conf)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert [line.split("\t")[0] for line in lines] == ["LAPTOP", "PHONE"]
    assert "Phone" in lines[1] and "127.0.0.1" in lines[1]

    revoked = run_py("sessions", "revoke", "@alice:localhost", "--device", "PHONE", "--config", conf)
    assert revoked.returncode == 0, revoked.stderr
    for _ in range(20):
        assert call(workers.port, WHOAMI, token=phone["access_token"])[0] == 401
    assert call(workers.port, WHOAMI, token=laptop["access_token"])[0] == 200

    for args in (["revoke", "alice", "--device", "PHONE"], ["revoke", "nobody", "--all"], ["list", "nobody"]):
        result = run_py("sessions", *args, "--config", conf)
        assert result.returncode == 1, result
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr

    revoked = run_py("sessions", "revoke", "alice", "--all", "--config", conf)
    assert revoked.returncode == 0, revoked.stderr
    assert call(workers.port, WHOAMI, token=laptop["access_token"])[0] == 401
    assert run_py("sessions", "list", "alice", "--config", conf).stdout == ""


def test_kill_9_during_logins_loses_no_200(conf):
    server = Server("--config", conf)
    answered: list[str] = []
    stop = threading.Event()

    def log_in_repeatedly() -> None:
        while not stop.is_set():
            try:
                status, body = login(server.port, "bob", "builder")
            except OSError:
                return  # the server is gone
            if status == 200:
                answered.append(body["access_token"])

    threads = [threading.Thread(target=log_in_repeatedly) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        while len(answered) < 20:
            threading.Event().wait(0.01)
        server.kill()
    finally:
        stop.set()
        for thread in threads:
            thread.join(15)
    tokens = list(answered)
    restarted = Server("--config", conf)
    try:
        for token in tokens:
            status, body = call(restarted.port, WHOAMI, token=token)
            assert status == 200, (token[-8:], body)
    finally:
        restarted.stop()


def test_secret_rotation_across_restarts_logs_nobody_out(conf):
    old, new = "o" * 40, "n" * 40
    env = dict(os.environ, HOMESERVER_AUTH__JWT_SECRET=old)
    server = Server("--config", conf, env=env)
    old_token = login(server.port, "alice", "wonderland")[1]["access_token"]
    server.stop()
    # Step 2: the new secret signs, the old one is still accepted.
    env.update(HOMESERVER_AUTH__JWT_SECRET=new, HOMESERVER_AUTH__PREVIOUS_JWT_SECRETS=f'["{old}"]')
    server = Server("--config", conf, env=env)
    try:
        assert call(server.port, WHOAMI, token=old_token)[0] == 200
        new_token = login(server.port, "alice", "wonderland")[1]["access_token"]
    finally:
        server.stop()
    # Step 4: the old secret dropped: its tokens end, the new ones live on.
    del env["HOMESERVER_AUTH__PREVIOUS_JWT_SECRETS"]
    server = Server("--config", conf, env=env)
    try:
        status, body = call(server.port, WHOAMI, token=old_token)
        assert (status, body["errcode"]) == (401, "M_UNKNOWN_TOKEN")
        assert call(server.port, WHOAMI, token=new_token)[0] == 200
    finally:
        server.stop()
