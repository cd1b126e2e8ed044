"""The deployment docs/delegation.md describes, with real parts, for the tests:
this server (`run.py`, its own process) as the authentication service of a real Synapse,
both behind a real nginx running conf/nginx-delegation.conf. Clients talk to nginx only.

One stack serves the whole test session (Synapse's start is the slow part); tests keep
out of each other's way by using users of their own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.support.helpers import DEFAULT_USERS, JWT_SECRET, ci, record
from tests.support.nginx import Nginx, NginxUnavailable
from tests.support.synapse import Synapse, SynapseUnavailable, free_port, http

ROOT = Path(__file__).resolve().parents[2]
SERVER_NAME = "localhost"
SECRET = "synapse-and-homeserver-share-this-secret-0123456789"
LOGIN = "/_matrix/client/v3/login"
WHOAMI = "/_matrix/client/v3/account/whoami"
ADMIN = "admin"
# Users for the real-parts tests, one set per test so that device lists stay their own.
EXTRA_USERS = ["carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "mallory", "niaj", "olivia",
               "peggy", "rupert", "sybil", "trent", "victor", "walter", "xavier", "yolanda", ADMIN]
# Taken out of the users file by a test (the removed-user sweep).
REMOVABLE = "zoe"


def password_of(name: str) -> str:
    return {"alice": "wonderland", "bob": "builder"}.get(name, f"{name}-password")


def user_records(without: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    names = [*EXTRA_USERS, REMOVABLE]
    extra = [record(name, password_of(name), f" [{name}]", display_name=name.title()) for name in names]
    return [r for r in [dict(r) for r in DEFAULT_USERS] + extra if r["name"] not in without]


class HomeserverProcess:
    """`run.py --config` with delegation on, on a port chosen ahead (Synapse's config names it);
    `extra` is appended to its config (more sections), `delegation` to its `[delegation]`
    section (by default the directory sweep every 0.5 s, which ends a removed user's sessions)."""

    def __init__(self, folder: Path, port: int, public_url: str, synapse_url: str, extra: str = "",
                 delegation: str = "sync_interval = 0.5\n") -> None:
        self.folder = folder
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        (folder / "users.json").write_text(json.dumps({"users": user_records()}))
        self.config = folder / "homeserver.toml"
        self.config.write_text(
            f"""[server]
host = "127.0.0.1"
port = {port}
base_url = "{public_url}"
server_name = "{SERVER_NAME}"
trusted_proxies = ["127.0.0.1/32"]
[auth]
jwt_secret = "{JWT_SECRET}"
bcrypt_rounds = 4
[backend.file]
path = "users.json"
reload_interval = 0.2
[sessions]
sweep_interval = 0.5
[rate_limit]
enabled = false
[delegation]
enabled = true
synapse_url = "{synapse_url}"
secret = "{SECRET}"
admins = ["{ADMIN}"]
timeout = 2.0
retry_interval = 0.5
"""
            + delegation
            + extra
        )
        self.log_path = folder / "homeserver.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "run.py", "--config", str(self.config)],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"run.py exited:\n{self.log()}"
            try:
                if http(self.url + "/_matrix/client/versions", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"run.py did not answer:\n{self.log()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def remove_users(self, *names: str) -> None:
        """Take users out of the users file (the server reloads it by itself)."""
        path = self.folder / "users.json"
        path.write_text(json.dumps({"users": user_records(without=names)}))

    def run_py(self, *args: str) -> subprocess.CompletedProcess[str]:
        """A `run.py` command on this server's config (its store, its users)."""
        return subprocess.run(
            [sys.executable, "run.py", *args, "--config", str(self.config)],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )


class DelegationStack:
    """This server, Synapse and nginx, started in the order the docs give (ours, Synapse, nginx);
    `extra_config` is appended to this server's config."""

    def __init__(self, folder: Path, extra_config: str = "") -> None:
        self.nginx_port, hs_port, synapse_port = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.nginx_port}"
        self.homeserver = HomeserverProcess(
            folder, hs_port, self.url, f"http://127.0.0.1:{synapse_port}", extra_config
        )
        self.synapse = Synapse(
            folder / "synapse", SERVER_NAME, port=synapse_port, public_baseurl=self.url + "/",
            mas_endpoint=f"http://127.0.0.1:{hs_port}/", mas_secret=SECRET,
        )
        self.nginx: Nginx | None = None
        self._admin_token: str | None = None
        try:
            self.homeserver.start()
            self.synapse.start()
            self.nginx = Nginx(folder / "nginx", self.nginx_port, hs_port, synapse_port)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.nginx is not None:
            self.nginx.stop()
        self.synapse.stop()
        self.homeserver.stop()

    # -- calls through the proxy, as a client makes them ------------------------------------

    def call(self, path: str, body: Any = None, token: str | None = None, method: str | None = None) -> tuple[int, Any]:
        return http(self.url + path, body, token, method)

    def homeserver_call(self, path: str, body: Any = None, token: str | None = None,
                        method: str | None = None) -> tuple[int, Any]:
        """A call to this server directly, not through the proxy (what only it knows)."""
        return http(self.homeserver.url + path, body, token, method)

    def login(self, user: str, **extra: Any) -> dict[str, Any]:
        body = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user},
                "password": password_of(user), **extra}
        status, answer = self.call(LOGIN, body)
        assert status == 200, (status, answer, self.homeserver.log())
        return dict(answer)

    def whoami(self, token: str) -> tuple[int, Any]:
        return self.call(WHOAMI, token=token)

    # -- what Synapse holds (its admin API, called directly, not through the proxy) ---------

    def admin_token(self) -> str:
        if self._admin_token is None or self.whoami(self._admin_token)[0] != 200:
            self._admin_token = self.login(ADMIN, device_id="ADMINTESTS")["access_token"]
        return self._admin_token

    def synapse_devices(self, user: str) -> list[str]:
        """The device ids Synapse has for the user (its admin API)."""
        user_id = urllib.parse.quote(f"@{user}:{SERVER_NAME}")
        status, answer = http(f"{self.synapse.url}/_synapse/admin/v2/users/{user_id}/devices",
                              token=self.admin_token())
        if status == 404:
            return []
        assert status == 200, (status, answer)
        return sorted(d["device_id"] for d in answer["devices"])

    def our_devices(self, user: str) -> list[str]:
        """The device ids with a session here (`run.py sessions list`)."""
        result = self.homeserver.run_py("sessions", "list", user)
        assert result.returncode in (0, 1), result.stderr
        return sorted(line.split("\t")[0] for line in result.stdout.splitlines() if line.strip())


Stack = TypeVar("Stack", bound=DelegationStack)


def serve(kind: type[Stack], folder: Path) -> Iterator[Stack]:
    """A fixture's body: `kind(folder)` for its tests, stopped afterwards. Skipped with the
    reason when Synapse or nginx cannot be had, and failed for it when CI is set."""
    try:
        stack = kind(folder)
    except (SynapseUnavailable, NginxUnavailable) as exc:
        if ci():
            pytest.fail(f"{exc} (CI is set: the Synapse tests must run)")
        pytest.skip(str(exc))
    yield stack
    stack.stop()
