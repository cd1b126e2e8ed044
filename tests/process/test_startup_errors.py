"""Start-up errors are one line on stderr and exit status 1, never a traceback, with any number of processes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import DEFAULT_USERS, JWT_SECRET

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def taken_port():
    """A port something else listens on for the whole test."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.fixture
def run_server(tmp_path):
    (tmp_path / "users.json").write_text(json.dumps({"users": DEFAULT_USERS}))

    def run(*argv: str, extra: str = "") -> subprocess.CompletedProcess[str]:
        config = tmp_path / "homeserver.toml"
        config.write_text(
            f'[server]\nhost = "127.0.0.1"\nport = 0\n[auth]\njwt_secret = "{JWT_SECRET}"\n'
            f'[backend.file]\npath = "users.json"\n{extra}'
        )
        return subprocess.run(
            [sys.executable, str(ROOT / "run.py"), "--config", str(config), *argv],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )

    return run


def assert_one_line(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert proc.returncode == 1, proc
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("homeserver: error: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], proc.stderr


@pytest.mark.parametrize("processes", ["1", "3"])
def test_port_in_use(run_server, taken_port, processes):
    proc = run_server("--port", str(taken_port), "--processes", processes)
    assert_one_line(proc, "server.port", f"127.0.0.1:{taken_port}", "already in use")


@pytest.mark.parametrize("processes", ["1", "2"])
@pytest.mark.parametrize(
    "host, fragment",
    [("no such host", "cannot resolve 'no such host'"), ("192.0.2.1", "is not an address of this machine")],
)
def test_bad_host(run_server, processes, host, fragment):
    proc = run_server("--host", host, "--processes", processes)
    assert_one_line(proc, "server.host", fragment)


def test_metrics_port_taken(run_server, taken_port):
    metrics = f"[metrics]\nenabled = true\nport = {taken_port}\n"
    proc = run_server("--processes", "1", extra=metrics)
    assert_one_line(proc, "metrics.port", f"127.0.0.1:{taken_port}", "already in use")


def test_metrics_port_of_the_second_worker_taken(run_server):
    # Worker i listens on port + i: a free port whose next one is taken (held here).
    while True:
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            port = free.getsockname()[1]
        taken = socket.socket()
        try:
            taken.bind(("127.0.0.1", port + 1))
            taken.listen()
            break
        except (OSError, OverflowError):  # taken by someone else, or past 65535
            taken.close()
    with taken:
        proc = run_server("--processes", "2", extra=f"[metrics]\nenabled = true\nport = {port}\n")
    assert_one_line(proc, "metrics.port", f"127.0.0.1:{port + 1}", "already in use")


def test_metrics_port_past_the_last_port(run_server):
    proc = run_server("--processes", "2", extra="[metrics]\nenabled = true\nport = 65535\n")
    assert_one_line(proc, "metrics.port", "65536")


@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_plain_bcrypt_hash_in_the_users_file_names_the_record(run_server, tmp_path, processes):
    plain = {"name": "carol", "password": "$2b$12$" + "a" * 53, "ident": "-c"}
    (tmp_path / "users.json").write_text(json.dumps({"users": [*DEFAULT_USERS, plain]}))
    proc = run_server("--processes", processes)
    assert_one_line(proc, "record 2 ('carol')", "bcrypt hash as plain text, not its hex text")
