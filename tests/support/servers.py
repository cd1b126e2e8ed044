"""`run.py` server processes for tests that need real processes, and plain HTTP calls to them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.helpers import DEFAULT_USERS, JWT_SECRET, Response
from tests.support.redis_servers import free_port, wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOGIN = "/_matrix/client/v3/login"
WHOAMI = "/_matrix/client/v3/account/whoami"


def call(port: int, path: str, body: Any = None, token: str | None = None, method: str | None = None) -> tuple[int, Any]:
    """One request on a new connection to a server process; (status, JSON body)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}"} if token else {},
        method=method,
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def login(port: int, user: str, password: str, **extra: Any) -> tuple[int, Any]:
    body = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user}, "password": password}
    return call(port, LOGIN, {**body, **extra})


def run_py(*args: str, env: dict[str, str] | None = None, stdin: str = "") -> subprocess.CompletedProcess:
    """Run a `run.py` command to completion."""
    return subprocess.run(
        [sys.executable, "run.py", *args], cwd=ROOT, env=env, input=stdin, capture_output=True, text=True, timeout=60
    )


def write_config(folder: Any, extra: str = "") -> str:
    """A config in `folder` on the file backend (the test users) and its default SQLite
    session store, plus `extra` TOML; its path."""
    (folder / "users.json").write_text(json.dumps({"users": DEFAULT_USERS}))
    path = folder / "homeserver.toml"
    path.write_text(
        f'[auth]\njwt_secret = "{JWT_SECRET}"\n[backend.file]\npath = "users.json"\n'
        f'[logging]\nlevel = "WARNING"\n{extra}'
    )
    return str(path)


class Server:
    """A `run.py` serving on a free port until `stop()` (or `kill()`)."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, port: int | None = None) -> None:
        self.port = port or free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "run.py", "--port", str(self.port), *args],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            wait_until(lambda: call(self.port, "/_matrix/client/versions")[0] == 200, 20, f"server on {self.port}")
        except BaseException:
            self.kill()
            raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


class ServerProcess:
    """`python run.py --config ...` on a port of its own choosing, read from its log."""

    def __init__(
        self,
        tmp_path: Path,
        processes: int = 1,
        _extra: str = "",
        users: list[dict[str, Any]] | None = None,
        **server: object,
    ) -> None:
        self.users = tmp_path / "users.json"
        self.users.write_text(json.dumps({"users": DEFAULT_USERS if users is None else users}))
        lines = [
            "[server]",
            'host = "127.0.0.1"',
            "port = 0",
            f"processes = {processes}",
            *(f"{key} = {json.dumps(value)}" for key, value in server.items()),
            "[auth]",
            f'jwt_secret = "{JWT_SECRET}"',
            "[backend.file]",
            'path = "users.json"',
            "reload_interval = 0",
            "[rate_limit]",
            "enabled = false",
        ]
        config = tmp_path / "homeserver.toml"
        config.write_text("\n".join(lines) + "\n" + _extra)
        self.log = tmp_path / "server.log"
        self.log_file = open(self.log, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "run.py", "--config", str(config)],
            cwd=ROOT,
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self.port = self._wait_for_port()

    def _wait_for_port(self, timeout: float = 20.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log.read_text(errors="replace")
            for line in text.splitlines():
                if "listening on 127.0.0.1:" in line:
                    return int(line.split("listening on 127.0.0.1:")[1].split()[0])
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"server did not start:\n{self.log.read_text(errors='replace')}")

    def request(
        self, path: str, body: dict | None = None, timeout: float = 20.0, token: str | None = None
    ) -> tuple[int, dict]:
        resp = self.fetch(path, body, timeout=timeout, token=token)
        return resp.status, resp.json

    def fetch(
        self,
        path: str,
        body: dict | None = None,
        *,
        method: str | None = None,
        token: str | None = None,
        timeout: float = 20.0,
    ) -> Response:
        """One request on a new connection; the whole response (for assertions and OpenAPI checks)."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return Response(resp.status, resp.headers, resp.read())
        except urllib.error.HTTPError as exc:
            with exc:
                return Response(exc.code, exc.headers, exc.read())

    def wait_log(self, text: str, timeout: float = 10.0) -> None:
        self.wait_log_count(text, 1, timeout)

    def wait_log_count(self, text: str, count: int, timeout: float = 10.0) -> None:
        """Wait until `text` stands in the log at least `count` times."""
        deadline = time.monotonic() + timeout
        while self.log.read_text(errors="replace").count(text) < count:
            assert time.monotonic() < deadline, f"{text!r} not logged {count} times:\n{self.log.read_text(errors='replace')}"
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log_file.close()
