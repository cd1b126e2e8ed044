"""A real Synapse for tests and the bench: matrix-synapse from PyPI in a cached virtualenv
outside the repository, SQLite, a free port, a generated config, run as a subprocess.

The virtualenv lives in `~/.cache/homeserver-tests/synapse-<version>` (or under
`$HOMESERVER_TEST_CACHE`), made once and reused by every run; moving the pinned version
makes a new one. `python3 tests/support/synapse.py install` makes it (and adds EXTRAS) ahead of time
(scripts/install-test-services.sh does, so a fresh clone under CI has it).

Only the standard library here: the install script runs this file with any Python 3.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

# The release the protocol notes were measured against (../shared/notes/delegation.md).
SYNAPSE_VERSION = "1.163.2"
CACHE = Path(os.environ.get("HOMESERVER_TEST_CACHE") or Path.home() / ".cache" / "homeserver-tests")
INSTALLED_MARK = ".installed"

# Every rate limit a test or a load run could reach, raised out of the way.
_UNLIMITED = {"per_second": 1_000_000, "burst_count": 1_000_000}
RATE_LIMITS: dict[str, Any] = {
    "rc_message": _UNLIMITED,
    "rc_login": {"address": _UNLIMITED, "account": _UNLIMITED, "failed_attempts": _UNLIMITED},
    "rc_registration": _UNLIMITED,
    "rc_joins": {"local": _UNLIMITED, "remote": _UNLIMITED},
    "rc_joins_per_room": _UNLIMITED,
    "rc_invites": {"per_room": _UNLIMITED, "per_user": _UNLIMITED, "per_issuer": _UNLIMITED},
    "rc_room_creation": _UNLIMITED,
    "rc_profile": _UNLIMITED,
    "rc_presence": {"per_user": _UNLIMITED},
    "rc_key_requests": _UNLIMITED,
    "rc_3pid_validation": _UNLIMITED,
    "rc_delayed_event_mgmt": _UNLIMITED,
    "rc_reports": _UNLIMITED,
}


class SynapseUnavailable(Exception):
    """Synapse cannot be had here (no network for pip, no venv module...): the reason."""


def venv_dir() -> Path:
    return CACHE / f"synapse-{SYNAPSE_VERSION}"


def synapse_python(install: bool = True) -> Path:
    """The Python of the cached Synapse virtualenv, made (once, under a lock) when missing."""
    venv = venv_dir()
    python = venv / "bin" / "python"
    if (venv / INSTALLED_MARK).exists():
        return python
    if not install:
        raise SynapseUnavailable(f"matrix-synapse {SYNAPSE_VERSION} is not installed in {venv}")
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"synapse-{SYNAPSE_VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run may be installing it right now
        if (venv / INSTALLED_MARK).exists():
            return python
        shutil.rmtree(venv, ignore_errors=True)  # a half-made one from an interrupted run
        base = getattr(sys, "_base_executable", None) or sys.executable
        steps = [
            [base, "-m", "venv", str(venv)],
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             f"matrix-synapse=={SYNAPSE_VERSION}"],
        ]
        for step in steps:
            try:
                result = subprocess.run(step, capture_output=True, text=True, timeout=1200)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise SynapseUnavailable(f"installing matrix-synapse failed: {exc}") from None
            if result.returncode != 0:
                raise SynapseUnavailable(
                    f"installing matrix-synapse failed ({' '.join(step[:3])}): {result.stderr.strip()[-500:]}"
                )
        (venv / INSTALLED_MARK).write_text(SYNAPSE_VERSION + "\n")
    return python


# What the migration tests add to Synapse's virtualenv (tests/support/synapse_before.py): the
# driver Synapse itself uses for PostgreSQL, and the LDAP module whose deployments move here
# (0.4: the release next.md's facts were read from).
EXTRAS = ("psycopg2-binary==2.9.13", "matrix-synapse-ldap3==0.4.0")


def synapse_extras(*requirements: str) -> Path:
    """The Python of Synapse's virtualenv with `requirements` (of EXTRAS) installed into it,
    once each, under the install's lock; they only add packages (pip keeps Synapse's own)."""
    python = synapse_python()
    venv = venv_dir()
    missing = [r for r in requirements if not (venv / f".extra-{r}").exists()]
    if not missing:
        return python
    with open(CACHE / f"synapse-{SYNAPSE_VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        missing = [r for r in requirements if not (venv / f".extra-{r}").exists()]
        if not missing:
            return python
        step = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *missing]
        try:
            result = subprocess.run(step, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SynapseUnavailable(f"installing {' '.join(missing)} into Synapse's virtualenv failed: {exc}") from None
        if result.returncode != 0:
            raise SynapseUnavailable(
                f"installing {' '.join(missing)} into Synapse's virtualenv failed: {result.stderr.strip()[-500:]}"
            )
        for requirement in missing:
            (venv / f".extra-{requirement}").write_text(requirement + "\n")
    return python


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http(url: str, body: Any = None, token: str | None = None, method: str | None = None,
         timeout: float = 30) -> tuple[int, Any]:
    """One JSON request; (status, parsed body or None)."""
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(
        url, data=None if body is None else json.dumps(body).encode(), headers=headers, method=method
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        with exc:
            raw = exc.read()
        try:
            return exc.code, json.loads(raw) if raw else None
        except ValueError:
            return exc.code, raw.decode(errors="replace")


class Synapse:
    """One Synapse on SQLite in `folder`, listening on 127.0.0.1:`port` (client API only).

    `mas_endpoint` + `mas_secret` turn on `matrix_authentication_service` (this server as
    its authentication service); without them Synapse checks its own tokens and passwords.
    """

    def __init__(
        self,
        folder: Path,
        server_name: str = "localhost",
        *,
        port: int | None = None,
        public_baseurl: str | None = None,
        mas_endpoint: str | None = None,
        mas_secret: str | None = None,
        log_level: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.server_name = server_name
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.public_baseurl = public_baseurl or self.url + "/"
        self.mas_endpoint = mas_endpoint
        self.mas_secret = mas_secret
        self.log_level = log_level  # None: Synapse's default (INFO, every request logged)
        self.extra = extra or {}  # more config keys (user_directory, say), over the defaults
        self.registration_secret = secrets.token_urlsafe(32)
        self.config_path = self.folder / "homeserver.yaml"
        self.log_path = self.folder / "synapse.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._write_config()

    def config(self) -> dict[str, Any]:
        """The config as a dict (written as JSON, which is YAML)."""
        folder = self.folder
        config: dict[str, Any] = {
            "server_name": self.server_name,
            "public_baseurl": self.public_baseurl,
            "pid_file": str(folder / "homeserver.pid"),
            "listeners": [{
                "port": self.port,
                "bind_addresses": ["127.0.0.1"],
                "type": "http",
                "tls": False,
                "x_forwarded": True,  # behind nginx: the client address from X-Forwarded-For
                "resources": [{"names": ["client"], "compress": False}],
            }],
            "database": {"name": "sqlite3", "args": {"database": str(folder / "homeserver.db")}},
            "media_store_path": str(folder / "media_store"),
            "signing_key_path": str(folder / "signing.key"),
            "report_stats": False,
            "serve_server_wellknown": True,
            "enable_registration": False,
            "registration_shared_secret": self.registration_secret,
            "macaroon_secret_key": secrets.token_urlsafe(32),
            "form_secret": secrets.token_urlsafe(32),
            # No network: no key servers, federation with nobody.
            "trusted_key_servers": [],
            "suppress_key_server_warning": True,
            "federation_domain_whitelist": [self.server_name],
            "presence": {"enabled": False},
            # Background updates at once, not spread out: on a fresh SQLite database
            # `reactivate_user` answers 500 until `profiles_full_user_id_key_idx` has run
            # (../shared/notes/next.md).
            "background_updates": {"sleep_enabled": False},
            **RATE_LIMITS,
        }
        if self.log_level:
            config["log_config"] = str(folder / "log.yaml")
        if self.mas_endpoint:
            config["matrix_authentication_service"] = {
                "enabled": True,
                "endpoint": self.mas_endpoint,
                "secret": self.mas_secret,
            }
            # As docs/delegation.md: the user store gives the profile (the name ends with the
            # ident); users cannot set another one at Synapse, nor one per room.
            config["enable_set_displayname"] = False
            config["enable_set_avatar_url"] = False
            config["allow_per_room_profiles"] = False
        config.update(self.extra)
        return config

    def _write_config(self) -> None:
        key = self.folder / "signing.key"
        if not key.exists():
            # Synapse's format: algorithm, key id, unpadded base64 of the 32-byte ed25519 seed.
            seed = base64.b64encode(secrets.token_bytes(32)).decode().rstrip("=")
            key.write_text(f"ed25519 a_test {seed}\n")
        self.config_path.write_text(json.dumps(self.config(), indent=1) + "\n")
        if self.log_level:
            logging = {
                "version": 1,
                "disable_existing_loggers": False,
                "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
                "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
                "root": {"level": self.log_level, "handlers": ["console"]},
            }
            (self.folder / "log.yaml").write_text(json.dumps(logging) + "\n")

    def start(self, timeout: float = 240) -> None:
        """Start Synapse and wait until its client API answers."""
        python = synapse_python()
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [str(python), "-m", "synapse.app.homeserver", "-c", str(self.config_path)],
            cwd=self.folder, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        self.starts += 1
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SynapseUnavailable(f"Synapse exited with {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(OSError):
                if http(self.url + "/_matrix/client/versions", timeout=2)[0] == 200:
                    return
            time.sleep(0.25)
        self.stop()
        raise SynapseUnavailable(f"Synapse did not answer within {timeout:g} s:\n{self.log_tail()}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def log_tail(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""

    def register(self, user: str, password: str, admin: bool = False) -> str:
        """A user made with Synapse's shared-secret registration (no delegation only); its token."""
        import hashlib
        import hmac

        status, nonce = http(self.url + "/_synapse/admin/v1/register")
        assert status == 200, (status, nonce)
        mac = hmac.new(self.registration_secret.encode(), digestmod=hashlib.sha1)
        mac.update(b"\x00".join([nonce["nonce"].encode(), user.encode(), password.encode(),
                                 b"admin" if admin else b"notadmin"]))
        body = {"nonce": nonce["nonce"], "username": user, "password": password, "admin": admin,
                "mac": mac.hexdigest()}
        status, answer = http(self.url + "/_synapse/admin/v1/register", body)
        assert status == 200, (status, answer)
        return str(answer["access_token"])


if __name__ == "__main__":
    if sys.argv[1:] != ["install"]:
        sys.exit("usage: python3 tests/support/synapse.py install")
    try:
        print(f"matrix-synapse {SYNAPSE_VERSION}: {synapse_extras(*EXTRAS).parent.parent}")
    except SynapseUnavailable as exc:
        sys.exit(f"tests/support/synapse.py: {exc}")
