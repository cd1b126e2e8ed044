"""Workers exit when their parent dies: no orphans left holding the port after a `kill -9`."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from homeserver.process import workers
from tests.support.servers import ROOT


def gone(pid: int) -> bool:
    """True once `pid` has exited (a zombie waiting for its new parent to reap it counts)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
        except OSError:
            return False
    return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_exit_when_the_parent_is_killed(start):
    server = start(processes=2)
    deadline = time.monotonic() + 20
    while server.log.read_text().count(") serving") < 2:
        assert time.monotonic() < deadline, server.log.read_text()
        time.sleep(0.05)
    pids = [int(pid) for pid in re.findall(r"started worker \d \(pid (\d+)\)", server.log.read_text())]
    assert len(pids) == 2 and server.request("/health")[0] == 200
    server.proc.kill()
    server.proc.wait()
    try:
        deadline = time.monotonic() + 10
        while not all(gone(pid) for pid in pids) or not port_is_free(server.port):
            assert time.monotonic() < deadline, f"orphans left: {pids}\n{server.log.read_text()}"
            time.sleep(0.1)
    finally:  # never leave them running past a failure
        for pid in pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
    assert "parent process" in server.log.read_text() or "shutting down" in server.log.read_text()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_die_with_parent_sets_sigterm_as_the_parent_death_signal():
    script = (
        "import ctypes, os\n"
        "from homeserver.process.workers import die_with_parent\n"
        "assert die_with_parent(os.getppid())\n"
        "sig = ctypes.c_int()\n"
        "ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG\n"
        "print(sig.value)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == signal.SIGTERM


async def test_watch_parent_fallback(monkeypatch):
    stopped = asyncio.Event()
    watch = asyncio.ensure_future(workers.watch_parent(os.getppid(), stopped.set, interval=0.01))
    await asyncio.sleep(0.1)
    assert not watch.done()  # the parent is alive: keep serving
    monkeypatch.setattr(workers.os, "getppid", lambda: 1)  # re-parented: the parent died
    await asyncio.wait_for(watch, 5)
    assert stopped.is_set()
