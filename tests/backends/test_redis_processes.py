"""Two `run.py` server processes share one Redis: users added or removed show up in both at once."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.support.helpers import JWT_SECRET
from tests.support.redis_servers import free_port, wait_until
from tests.support.servers import ROOT, call, login


@pytest.fixture
def env(redis_users) -> dict[str, str]:
    """The documented environment overrides selecting Redis; no config file is written."""
    return dict(
        os.environ,
        HOMESERVER_BACKEND__TYPE="redis",
        HOMESERVER_BACKEND__REDIS__URL=redis_users.url,
        HOMESERVER_BACKEND__REDIS__KEY_PREFIX=redis_users.prefix,
        HOMESERVER_AUTH__JWT_SECRET=JWT_SECRET,
        HOMESERVER_RATE_LIMIT__ENABLED="false",
    )


@pytest.fixture
def servers(env, tmp_path) -> Iterator[list[int]]:
    """Two `python run.py --port N` processes; their ports (their output kept for a failure)."""
    procs: list[subprocess.Popen] = []
    ports = [free_port()]
    while len(ports) < 2:
        port = free_port()
        if port not in ports:
            ports.append(port)
    logs = [tmp_path / f"server-{port}.log" for port in ports]
    try:
        for port, log in zip(ports, logs, strict=True):
            with open(log, "wb") as out:
                procs.append(subprocess.Popen(
                    [sys.executable, "run.py", "--port", str(port)],
                    cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                ))
        for port, log in zip(ports, logs, strict=True):
            try:
                wait_until(lambda port=port: call(port, "/_matrix/client/versions")[0] == 200, 20, f"server on {port}")
            except AssertionError as exc:
                raise AssertionError(f"{exc}:\n{log.read_text(errors='replace')}") from None
        yield ports
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)


def test_processes_share_the_store(servers, env, redis_users):
    a, b = servers
    assert login(a, "nina", "pw")[0] == 403
    added = subprocess.run(
        [sys.executable, "run.py", "add-user", "nina", "--ident", "nina-id", "--rounds", "4"],
        cwd=ROOT, env=env, input="pw\n", capture_output=True, text=True, timeout=60,
    )
    assert added.returncode == 0, added.stderr
    # No restart: both processes read the new hash on the next request.
    status, body = login(a, "nina", "pw")
    assert status == 200, body
    token = body["access_token"]
    assert login(b, "NINA", "pw")[1]["user_id"] == "@nina:localhost"
    assert call(b, "/_matrix/client/v3/account/whoami", token=token)[0] == 200
    assert call(b, "/_matrix/client/v3/profile/@nina:localhost") == (200, {"displayname": "nina-id"})
    redis_users.client.delete(redis_users.prefix + "nina")
    for port in servers:
        status, body = call(port, "/_matrix/client/v3/account/whoami", token=token)
        assert (status, body["errcode"]) == (401, "M_UNKNOWN_TOKEN")
