"""The directory sweep runs in one process of all those serving, once per interval: two worker
processes on one SQLite session file, and two servers (two machines) on one Redis, each
`run.py` for real, against the fake Synapse (which counts every call: the real Synapse's own
log would not tell one provisioning from two as plainly)."""

from __future__ import annotations

import re
import secrets
import time
from pathlib import Path

import pytest

from tests.support.delegation_fakes import SECRET, FakeSynapseThread
from tests.support.helpers import record
from tests.support.redis_servers import redis_url  # noqa: F401  (fixture)
from tests.support.servers import ServerProcess

USERS = [record(f"user{n:02d}", ident=f" [{n}]", display_name=f"User {n}") for n in range(60)]
INTERVAL = 0.5
SUMMARY = re.compile(r"directory sweep: 60 users in the user store: (\d+) provisioned")


@pytest.fixture
def synapse():
    fake = FakeSynapseThread()
    yield fake
    fake.close()


def delegation(synapse: FakeSynapseThread) -> str:
    return (f'[delegation]\nenabled = true\nsynapse_url = "{synapse.url}"\nsecret = "{SECRET}"\n'
            f"timeout = 2.0\nsync_interval = {INTERVAL}\n")


def summaries(*servers: ServerProcess) -> list[int]:
    """The provisioned count of every sweep the servers logged."""
    return [int(n) for server in servers for n in SUMMARY.findall(server.log.read_text(errors="replace"))]


def watch(synapse: FakeSynapseThread, servers: list[ServerProcess], seconds: float) -> list[int]:
    deadline = time.monotonic() + 20
    while sum(1 for _ in summaries(*servers)) == 0:
        assert time.monotonic() < deadline, "no sweep logged:\n" + servers[0].log.read_text(errors="replace")
        time.sleep(0.1)
    time.sleep(seconds)
    return summaries(*servers)


def assert_swept_once(synapse: FakeSynapseThread, sweeps: list[int], seconds: float) -> None:
    fake = synapse.fake
    provisioned = [body["localpart"] for name, body in fake.calls if name == "provision_user"]
    # Everyone provisioned, each exactly once: one sweep did it, not one per process.
    assert sorted(provisioned) == sorted(u["name"] for u in USERS), provisioned
    assert [n for n in sweeps if n] == [60], sweeps
    # One sweep per interval in all, give or take the jitter, not one per process.
    assert len(sweeps) <= seconds / INTERVAL + 2, sweeps


def test_two_workers_on_one_sqlite_file_sweep_once(tmp_path: Path, synapse):
    server = ServerProcess(tmp_path, 2, delegation(synapse), users=USERS)
    try:
        sweeps = watch(synapse, [server], 3.0)
    finally:
        server.stop()
    assert_swept_once(synapse, sweeps, 3.0 + 1)


def test_two_servers_on_one_redis_sweep_once(tmp_path: Path, synapse, redis_url):  # noqa: F811
    store = (f'[sessions]\nstore = "redis"\n[sessions.redis]\nurl = "{redis_url}"\n'
             f'key_prefix = "sweep:{secrets.token_hex(4)}:"\n')
    servers = []
    try:
        for name in ("one", "two"):
            folder = tmp_path / name
            folder.mkdir()
            servers.append(ServerProcess(folder, 1, store + delegation(synapse), users=USERS))
        sweeps = watch(synapse, servers, 3.0)
    finally:
        for server in servers:
            server.stop()
    assert_swept_once(synapse, sweeps, 3.0 + 2)
