"""Every stop stops: a SIGTERM at any moment of a real server's life (while it loads, idle,
under load; one process or workers; uvloop or asyncio) starts its drain at once, and the
port is free for the next server (`kill; start`). SIGHUP during start-up reloads, never kills.

The signals are sent to `run.py` processes as an operator's `kill` or systemd sends them.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.process.test_shutdown import DEBUG, finish_upload, stalled_upload
from tests.support.helpers import DEFAULT_USERS, JWT_SECRET
from tests.support.redis_servers import free_port

ROOT = Path(__file__).resolve().parents[2]
LOGIN = json.dumps({"identifier": {"user": "alice"}, "password": "wonderland"}).encode()


def have_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


class Launched:
    """`run.py --config` started by the test, its standard error in a file."""

    def __init__(
        self, folder: Path, processes: int = 1, event_loop: str = "auto", port: int = 0, extra: str = "",
        preexec_fn: Callable[[], None] | None = None,
    ) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "users.json").write_text(json.dumps({"users": DEFAULT_USERS}))
        config = folder / "homeserver.toml"
        config.write_text(
            f'[server]\nhost = "127.0.0.1"\nport = {port}\nprocesses = {processes}\nevent_loop = "{event_loop}"\n'
            f'drain_timeout = 2.0\n[auth]\njwt_secret = "{JWT_SECRET}"\n[backend.file]\npath = "users.json"\n'
            f"reload_interval = 0\n[rate_limit]\nenabled = false\n{extra}"
        )
        self.processes = processes
        self.log = folder / f"server-{time.monotonic_ns()}.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "run.py", "--config", str(config)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, preexec_fn=preexec_fn,
            )
        self._port = port

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_log_count(self, text: str, count: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while self.text().count(text) < count:
            assert self.proc.poll() is None or self.text().count(text) >= count, f"exited {self.proc.poll()}:\n{self.text()}"
            assert time.monotonic() < deadline, f"{text!r} not logged {count} times:\n{self.text()}"
            time.sleep(0.01)

    def wait_log(self, text: str, timeout: float = 20.0) -> None:
        self.wait_log_count(text, 1, timeout)

    def wait_serving(self) -> None:
        if self.processes == 1:
            self.wait_log("listening on 127.0.0.1:")
        else:
            self.wait_log_count(") serving", self.processes)

    @property
    def port(self) -> int:
        if not self._port:
            self.wait_log("listening on 127.0.0.1:")
            self._port = int(self.text().split("listening on 127.0.0.1:")[1].split()[0])
        return self._port

    def get(self, path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    def end(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def load(server: Launched, until: threading.Event) -> None:
    """Requests, one after another, until told to stop (their failures after the stop are expected)."""
    while not until.is_set():
        try:
            request = urllib.request.Request(f"http://127.0.0.1:{server.port}/_matrix/client/v3/login", data=LOGIN)
            urllib.request.urlopen(request, timeout=5).read()
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/_matrix/client/versions", timeout=5).read()
        except OSError:
            time.sleep(0.01)


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def stop_once(folder: Path, processes: int, event_loop: str, moment: str) -> None:
    server = Launched(folder, processes, event_loop)
    until = threading.Event()
    loaders: list[threading.Thread] = []
    try:
        if moment == "loading":  # anywhere in start-up: imports, config, stores, loop
            time.sleep(random.uniform(0.0, 0.8))
        elif moment == "first line":  # start-up under way: the user store is loaded
            server.wait_log(" INFO ")
        else:
            server.wait_serving()
            if moment == "under load":
                loaders = [threading.Thread(target=load, args=(server, until)) for _ in range(3)]
                for thread in loaders:
                    thread.start()
                time.sleep(0.3)
            else:
                time.sleep(random.uniform(0.0, 0.2))
        port = server.port if "listening on" in server.text() else None
        server.proc.send_signal(signal.SIGTERM)
        # The drain begins at once and lasts at most drain_timeout (2 s): exit well before 20 s.
        code = server.proc.wait(20)
        until.set()
        log = server.text()
        if code == -signal.SIGTERM:
            # Only before run.py's first lines (the interpreter starting): nothing ours had run.
            assert moment == "loading" and log == "", log
            return
        assert code == 0, log
        assert "shutting down" in log and "Traceback" not in log, log
        if port is not None:
            assert port_is_free(port), log
    finally:
        until.set()
        for thread in loaders:
            thread.join(10)
        server.end()


MOMENTS = ["loading", "first line", "idle", "under load"]


@pytest.mark.parametrize(
    "processes, event_loop, stops",
    [(1, "uvloop", 24), (1, "asyncio", 12), (2, "uvloop", 16)],
)
def test_every_stop_stops(tmp_path, processes, event_loop, stops):
    """50 stops at every moment of a server's life: each a clean exit 0 with a drain line (the
    reported stop that served on, or ended with status 143 and no line, is gone)."""
    if event_loop == "uvloop" and not have_uvloop():
        pytest.skip("uvloop is not installed")
    for index in range(stops):
        stop_once(tmp_path / str(index), processes, event_loop, MOMENTS[index % len(MOMENTS)])


def test_a_stop_while_loading_is_logged_as_such(tmp_path):
    server = Launched(tmp_path)
    try:
        server.wait_log(" INFO ")  # the user store loaded, the session store not yet served
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(20) == 0
        log = server.text()
        assert "shutting down: SIGTERM during start-up, nothing served" in log or "shutting down: 0 requests" in log, log
    finally:
        server.end()


@pytest.mark.parametrize("processes", [1, 2])
def test_kill_then_start_on_the_same_port(tmp_path, processes):
    """A new server binds the port while the old one still drains a request in flight."""
    port = free_port()
    old = Launched(tmp_path / "old", processes, port=port, extra=DEBUG)
    new: Launched | None = None
    try:
        old.wait_serving()
        sock = stalled_upload(old)
        old.proc.send_signal(signal.SIGTERM)
        old.wait_log_count("shutting down", processes)
        new = Launched(tmp_path / "new", processes, port=port)
        new.wait_serving()
        assert "already in use" not in new.text()
        assert finish_upload(sock).startswith(b"HTTP/1.1 200")  # the old one finished its request
        assert old.proc.wait(20) == 0
        assert new.get("/_matrix/client/versions") == 200
        new.proc.send_signal(signal.SIGTERM)
        assert new.proc.wait(20) == 0
    finally:
        old.end()
        if new is not None:
            new.end()


@pytest.mark.parametrize("processes", [1, 2])
def test_sighup_during_start_up_reloads_and_never_kills(tmp_path, processes):
    """`systemctl reload` just after `start` used to kill a server still loading (SIGHUP's
    default action, which systemd counts as a clean exit: no restart)."""
    server = Launched(tmp_path, processes)
    try:
        server.wait_log(" INFO ")
        server.proc.send_signal(signal.SIGHUP)
        server.wait_serving()
        if processes == 1:  # read once more after start-up; workers read the file after it anyway
            server.wait_log_count("reloaded users file", 1)
        assert server.get("/_matrix/client/versions") == 200
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(20) == 0
    finally:
        server.end()


def ignore_stops() -> None:
    """A launcher that leaves SIGTERM ignored in its children (inherited across exec)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def ignore_and_block_stops() -> None:
    """A launcher that leaves SIGTERM ignored and blocked in its children."""
    ignore_stops()
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM, signal.SIGHUP])


@pytest.mark.parametrize("launcher", [ignore_stops, ignore_and_block_stops])
def test_sigterm_stops_whatever_the_launcher_left(tmp_path, launcher):
    """The reported stop that did not stop: with SIGTERM ignored, one sent while the server
    loaded was lost (it then served on, no 'shutting down'; a second SIGTERM stopped it);
    with SIGTERM blocked, none ever arrived."""
    server = Launched(tmp_path, preexec_fn=launcher)
    try:
        server.wait_log(" INFO ")
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(20) == 0
        assert "shutting down" in server.text()
    finally:
        server.end()


def test_other_commands_get_their_signals_back(tmp_path):
    """Only `serve` keeps the signals run.py notes: a command waiting at its prompt still
    ends on SIGTERM (here hash-password, reading standard input)."""
    proc = subprocess.Popen(
        [sys.executable, "run.py", "hash-password"], cwd=ROOT, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        time.sleep(1.0)  # imports done, reading standard input
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_early_signals_note_and_give_back():
    from homeserver.process.early_signals import EarlySignals

    seen: list[int] = []
    before = signal.signal(signal.SIGHUP, lambda signum, frame: seen.append(signum))
    try:
        early = EarlySignals()
        early.install()
        os.kill(os.getpid(), signal.SIGHUP)
        assert early.reloads == 1 and seen == []  # noted, the old handler not called
        early.release()
        assert seen == [signal.SIGHUP]  # given back, and the noted one sent again
        os.kill(os.getpid(), signal.SIGHUP)
        assert seen == [signal.SIGHUP, signal.SIGHUP]
    finally:
        signal.signal(signal.SIGHUP, before)
