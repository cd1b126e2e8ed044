"""The real server process: graceful shutdown, N workers, SIGHUP reload, slow clients."""

from __future__ import annotations

import concurrent.futures
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from backends.file import write_atomically
from tests.support.helpers import JWT_SECRET, record
from tests.support.servers import ServerProcess

ROOT = Path(__file__).resolve().parents[2]


LOGIN_BODY = json.dumps({"identifier": {"user": "alice"}, "password": "wonderland"}).encode()


# Debug lines tell the tests when a request is in flight (homeserver/handlers/body.py) and
# when a password check is queued (homeserver/passwords.py): they wait on those, not a clock.
DEBUG = '\n[logging]\nlevel = "DEBUG"\n'
READING = ": reading the body"


def stalled_upload(server: ServerProcess) -> socket.socket:
    """Start a login whose body has not all arrived: in flight until finished or cut.

    Deterministic where a slow bcrypt is not: the request waits for the test, not a clock.
    """
    seen = server.log.read_text(errors="replace").count(READING)
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(
        b"POST /_matrix/client/v3/login HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        + b"Content-Length: %d\r\n\r\n" % len(LOGIN_BODY)
        + LOGIN_BODY[:5]
    )
    server.wait_log_count(READING, seen + 1)  # the handler has started: the request is in flight
    return sock


def finish_upload(sock: socket.socket) -> bytes:
    """Send the rest of the body; return the whole response."""
    sock.sendall(LOGIN_BODY[5:])
    sock.settimeout(20)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    return data


def assert_unavailable_then_closed(sock: socket.socket) -> None:
    """The cut-off request got a Matrix 503, then the connection was closed."""
    sock.settimeout(20)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    sock.close()
    assert data.startswith(b"HTTP/1.1 503"), data
    assert b'"errcode":"M_UNKNOWN"' in data and b"Retry-After: 1" in data


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_in_flight_request_completes_then_exit_0(start, sig):
    server = start(_extra=DEBUG)
    sock = stalled_upload(server)
    server.proc.send_signal(sig)
    server.wait_log("shutting down: 1 requests in flight")
    # No new connections are taken from here on...
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
    # ...but the request in flight is served to the end.
    reply = finish_upload(sock)
    assert reply.startswith(b"HTTP/1.1 200"), reply
    assert b'"user_id":"@alice:localhost"' in reply
    assert server.proc.wait(timeout=20) == 0
    assert "stopped" in server.log.read_text()


def test_drain_timeout_cuts_off_slow_requests(start):
    server = start(drain_timeout=0.5, _extra=DEBUG)
    sock = stalled_upload(server)
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=20) == 0
    assert_unavailable_then_closed(sock)
    log = server.log.read_text()
    assert "shutting down: 1 requests in flight" in log and "1 requests still running; answering them 503" in log


def test_second_signal_cuts_the_drain_short(start):
    server = start(drain_timeout=60.0, _extra=DEBUG)
    sock = stalled_upload(server)
    server.proc.send_signal(signal.SIGINT)
    server.wait_log("shutting down")
    server.proc.send_signal(signal.SIGINT)
    assert server.proc.wait(timeout=20) == 0  # well before the 60 s drain timeout
    assert_unavailable_then_closed(sock)


def test_two_workers_share_the_socket_and_stop_gracefully(start):
    server = start(processes=2, _extra=DEBUG)
    pids = set()
    deadline = time.monotonic() + 20
    while len(pids) < 2 and time.monotonic() < deadline:
        # Fresh connections, several at once: the kernel hands them to whichever worker
        # is waiting, so both are seen soon.
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            for status, body in pool.map(lambda _: server.request("/health"), range(16)):
                assert status == 200
                pids.add(body["pid"])
    assert len(pids) == 2, pids
    assert server.proc.pid not in pids
    sock = stalled_upload(server)
    server.proc.send_signal(signal.SIGTERM)
    server.wait_log("shutting down: 1 requests in flight")
    assert finish_upload(sock).startswith(b"HTTP/1.1 200")
    assert server.proc.wait(timeout=20) == 0
    for pid in pids:  # no orphans left behind
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_crashed_worker_is_replaced(start):
    server = start(processes=2)
    server.wait_log("worker 1 (pid")
    _, body = server.request("/health")
    os.kill(body["pid"], signal.SIGKILL)
    server.wait_log("restarting it")
    server.wait_log_count(") serving", 3)  # the replacement is up
    for _ in range(10):
        assert server.request("/health")[0] == 200
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=20) == 0


def test_sighup_reloads_the_users_file(start):
    server = start()
    assert server.request("/_matrix/client/v3/profile/@zoe:localhost")[0] == 404
    write_atomically(str(server.users), json.dumps({"users": [record("zoe", ident="-zoe")]}).encode())
    server.proc.send_signal(signal.SIGHUP)
    server.wait_log("reloaded users file")
    assert server.request("/_matrix/client/v3/profile/@zoe:localhost") == (200, {"displayname": "-zoe"})
    assert server.request("/_matrix/client/v3/profile/@alice:localhost")[0] == 404
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=20) == 0


def test_slow_and_idle_connections_are_dropped(start):
    server = start(idle_timeout=0.5, body_timeout=0.5)
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(50)]
    slow_headers = socket.create_connection(("127.0.0.1", server.port))
    slow_headers.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # never finished
    slow_body = socket.create_connection(("127.0.0.1", server.port))
    slow_body.sendall(b"POST /_matrix/client/v3/login HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    # The server still answers others meanwhile.
    assert server.request("/health")[0] == 200
    for sock in [*idle, slow_headers, slow_body]:
        sock.settimeout(10)
        data = b""
        while chunk := sock.recv(65536):  # closed by the server within the timeouts
            data += chunk
        assert b"500" not in data.split(b"\r\n", 1)[0]
        sock.close()
    assert server.request("/health")[0] == 200


def free_port_pair() -> int:
    """A port P with P and P + 1 both free (worker 1's metrics listen on P + 1), picked below
    the kernel's ephemeral range: a port there (what binding port 0 gives) has a neighbour
    that any outgoing connection on the machine may hold as its local port."""
    for _ in range(200):
        port = random.randrange(20000, 32000)
        try:
            for candidate in (port, port + 1):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise AssertionError("no two free neighbouring ports")


def test_metrics_on_their_own_port_per_worker(tmp_path, start):
    port = free_port_pair()
    config_extra = f"\n[metrics]\nenabled = true\nport = {port}\n"
    server = start(processes=2, _extra=config_extra)
    server.wait_log(f"metrics on 127.0.0.1:{port + 1}")
    for p in (port, port + 1):
        with urllib.request.urlopen(f"http://127.0.0.1:{p}/metrics", timeout=10) as resp:
            assert resp.status == 200
            assert b"homeserver_logins_total" in resp.read()
    assert server.request("/metrics")[0] == 404  # not on the public listener
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=20) == 0


@pytest.mark.parametrize("processes", [1, 2])
def test_broken_users_file_at_start_is_exit_1(tmp_path, processes):
    (tmp_path / "users.json").write_text("{broken")
    config = tmp_path / "homeserver.toml"
    config.write_text(
        f'[server]\nport = 0\nprocesses = {processes}\n[auth]\njwt_secret = "{JWT_SECRET}"\n'
        '[backend.file]\npath = "users.json"\n'
    )
    proc = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 1, proc
    assert b"malformed JSON" in proc.stderr


@pytest.mark.parametrize("argv", [["--processes", "3"], ["serve", "--processes", "3"]])
def test_processes_flag_overrides_config(tmp_path, argv):
    from homeserver.cli import build_parser
    from homeserver.cli.serve import _config

    config = tmp_path / "homeserver.toml"
    config.write_text("[server]\nprocesses = 1\n")
    args = build_parser().parse_args(["--config", str(config), *argv])
    assert _config(args).get("server", "processes") == 3


# bcrypt at cost 15 ("pw"): about two seconds a check here, so the first login is still
# hashing, and the second queued behind it, when the drain times out.
SLOW_HASH = b"$2b$15$1hiUV/EPOsYXG4ujGcfjZePhMg6cRVOTe4XQxKQfoniSyTq9Jg/TC".hex()
LOGIN = {"identifier": {"user": "slow"}, "password": "pw"}


def test_drain_timeout_cuts_off_logins_without_tracebacks(start, monkeypatch):
    monkeypatch.setenv("HOMESERVER_AUTH__BCRYPT_WORKERS", "1")  # one check at a time: the second waits
    server = start(drain_timeout=0.2, _extra=DEBUG)
    server.users.write_text(json.dumps({"users": [{"name": "slow", "password": SLOW_HASH, "ident": "-s"}]}))
    server.proc.send_signal(signal.SIGHUP)
    server.wait_log("reloaded users file")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        logins = [pool.submit(server.request, "/_matrix/client/v3/login", LOGIN) for _ in range(2)]
        # Both read and in the login: one hashing, one queued for the pool.
        server.wait_log_count("password check queued (2 pending)", 1)
        server.proc.send_signal(signal.SIGTERM)
        answers = [login.result(timeout=30) for login in logins]
    assert server.proc.wait(timeout=30) == 0
    assert [status for status, _ in answers] == [503, 503], answers
    log = server.log.read_text()
    assert "shutting down: 2 requests in flight" in log and "2 requests still running; answering them 503" in log, log
    # The cut-off is logged at debug only (this test runs at debug, to wait on the queue).
    loud = [line for line in log.splitlines() if " DEBUG " not in line]
    assert "Traceback" not in log and "uncaught" not in log, log
    assert not any("CancelledError" in line for line in loud), log
