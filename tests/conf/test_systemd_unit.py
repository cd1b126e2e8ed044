"""The shipped systemd unit, followed as it says: its directories, owners and modes, its user.

No systemd here: the test lays out what the unit and its install comments make (the config
folder root:homeserver, the state directory owned by the service user with the unit's mode,
$STATE_DIRECTORY, the unit's environment and umask) and starts the shipped config as an
unprivileged throwaway system user.
"""

from __future__ import annotations

import grp
import os
import pwd
import secrets
import shlex
import shutil
import signal
import site
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.helpers import ci
from tests.support.redis_servers import free_port
from tests.support.servers import call, login

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "conf" / "homeserver.service"


def unit_service_section() -> dict[str, list[str]]:
    """The [Service] keys of the shipped unit, each with its values in order."""
    section: dict[str, list[str]] = {}
    current = None
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            current = line
            continue
        if current == "[Service]":
            key, _, value = line.partition("=")
            section.setdefault(key, []).append(value)
    return section


def throwaway_user_possible() -> str | None:
    """Why the test cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root: it creates a throwaway system user and starts the server as that user"
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        return "needs useradd and userdel (Debian's passwd package)"
    return None


@pytest.fixture
def service_user() -> Iterator[str]:
    """A throwaway system user with its own group, as the unit's install comment creates it."""
    reason = throwaway_user_possible()
    if reason:
        if ci():
            pytest.fail(reason)
        pytest.skip(reason)
    name = f"hs-test-{secrets.token_hex(3)}"
    subprocess.run(
        ["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True, capture_output=True,
    )
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", name], capture_output=True)  # when userdel left it


@dataclass
class Layout:
    opt: Path  # /opt/homeserver: a copy of the project
    etc: Path  # /etc/homeserver
    state: Path  # /var/lib/homeserver
    config: Path
    user: str
    python: list[str]  # /opt/homeserver/.venv/bin/python: an interpreter the user can run
    env: dict[str, str]  # what makes the project's requirements importable for it


def runs_as(user: str, argv: list[str], env: dict[str, str]) -> bool:
    try:
        proc = subprocess.run(argv, user=user, group=user, extra_groups=[], env=env, cwd="/", capture_output=True,
                              timeout=60)
    except OSError:
        return False
    return proc.returncode == 0


def python_for(user: str, opt: Path) -> tuple[list[str], dict[str, str]]:
    """An interpreter of this Python version and the requirements, both usable by `user`.

    This test's own virtualenv may sit where the service user cannot look (under /root):
    then Debian's python3.X with this virtualenv's packages, else a fresh virtualenv in
    /opt/homeserver/.venv from requirements.txt, as the install comment has it.
    """
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [os.path.realpath(sys.executable), f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"]
    check = ["-c", "import tornado, jose, bcrypt, redis, ldap3, prometheus_client"]
    packages = {"PYTHONPATH": os.pathsep.join(site.getsitepackages())}
    for python in dict.fromkeys(c for c in candidates if os.path.exists(c)):
        if not runs_as(user, [python, "-c", "pass"], {}):
            continue
        if runs_as(user, [python, *check], packages):
            return [python], packages
        venv = opt / ".venv"
        subprocess.run([python, "-m", "venv", str(venv)], check=True, capture_output=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-r", str(ROOT / "requirements.txt")]
        subprocess.run(pip, check=True, capture_output=True, timeout=600)
        return [str(venv / "bin" / "python")], {}
    reason = f"no Python {version} the service user {user} may run ({', '.join(candidates)})"
    if ci():
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture
def layout(service_user) -> Iterator[Layout]:
    """The unit's directories under a fresh root every user can traverse (pytest's tmp_path cannot be)."""
    unit = unit_service_section()
    assert unit["User"] == ["homeserver"] and unit["Group"] == ["homeserver"]
    assert unit["StateDirectory"] == ["homeserver"]
    base = Path(tempfile.mkdtemp(prefix="hs-unit-"))
    os.chmod(base, 0o755)
    uid, gid = pwd.getpwnam(service_user).pw_uid, grp.getgrnam(service_user).gr_gid
    try:
        # The project, copied to /opt/homeserver as the install comment says.
        opt = base / "opt" / "homeserver"
        os.makedirs(opt)
        os.chmod(base / "opt", 0o755)
        for name in ("homeserver", "backends"):
            shutil.copytree(ROOT / name, opt / name, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(ROOT / "run.py", opt / "run.py")
        subprocess.run(["chmod", "-R", "u=rwX,go=rX", str(opt)], check=True)
        python, env = python_for(service_user, opt)
        # As the install comment: /etc/homeserver root:homeserver 0750, files 0640.
        etc = base / "etc" / "homeserver"
        etc.mkdir(parents=True)
        os.chmod(base / "etc", 0o755)
        os.chown(etc, 0, gid)
        os.chmod(etc, 0o750)
        for name in ("homeserver.toml", "users.json"):
            shutil.copy(ROOT / "conf" / name, etc / name)
            os.chown(etc / name, 0, gid)
            os.chmod(etc / name, 0o640)
        # As systemd makes StateDirectory=: /var/lib/<name>, owned by User/Group, StateDirectoryMode.
        state = base / "var" / "lib" / unit["StateDirectory"][0]
        state.mkdir(parents=True)
        os.chmod(base / "var", 0o755)
        os.chmod(base / "var" / "lib", 0o755)
        os.chown(state, uid, gid)
        os.chmod(state, int(unit["StateDirectoryMode"][0], 8))
        yield Layout(
            opt=opt, etc=etc, state=state, config=etc / "homeserver.toml", user=service_user, python=python, env=env
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)


def start_as_unit(layout: Layout, port: int, *, state_directory: bool = True) -> subprocess.Popen[bytes]:
    """ExecStart= as the unit's User/Group, with its Environment=, UMask= and $STATE_DIRECTORY."""
    unit = unit_service_section()
    argv = shlex.split(unit["ExecStart"][0])
    assert argv[:2] == ["/opt/homeserver/.venv/bin/python", "/opt/homeserver/run.py"]
    args = [a.replace("/etc/homeserver", str(layout.etc)) for a in argv[2:]]
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", **layout.env}
    for line in unit.get("Environment", []):
        for assignment in shlex.split(line):
            key, _, value = assignment.partition("=")
            env[key] = value
    if state_directory:
        env["STATE_DIRECTORY"] = str(layout.state)
    return subprocess.Popen(
        [*layout.python, str(layout.opt / "run.py"), *args, "--port", str(port)],
        cwd=layout.opt,  # WorkingDirectory=/opt/homeserver
        env=env,
        user=layout.user,
        group=layout.user,
        extra_groups=[],
        umask=int(unit["UMask"][0], 8),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )


def test_the_shipped_unit_starts_and_writes_only_its_state_directory(layout):
    before = sorted(os.listdir(layout.etc))
    port = free_port()
    proc = start_as_unit(layout, port)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if call(port, "/_matrix/client/versions")[0] == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)
        status, body = login(port, "alice", "wonderland")
        assert status == 200, body
        assert call(port, "/_matrix/client/v3/account/whoami", token=body["access_token"])[0] == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    assert proc.returncode == 0, stderr.decode()
    assert "Traceback" not in stderr.decode()
    # Every file the server wrote is in the state directory, the service user's, 0600.
    assert sorted(os.listdir(layout.etc)) == before
    written = {p.name: p.stat() for p in layout.state.iterdir()}
    assert {"sessions.db", "jwt.secret"} <= set(written), written
    uid = pwd.getpwnam(layout.user).pw_uid
    for name in ("sessions.db", "jwt.secret"):
        assert written[name].st_uid == uid
        assert stat.S_IMODE(written[name].st_mode) == 0o600, name


def test_without_a_state_directory_the_unwritable_folder_is_one_line(layout):
    # The failure the issue found (a PermissionError traceback): now one line naming the key.
    proc = start_as_unit(layout, free_port(), state_directory=False)
    _, stderr = proc.communicate(timeout=30)
    text = stderr.decode()
    assert proc.returncode == 1, text
    assert "Traceback" not in text
    errors = [line for line in text.splitlines() if line.startswith("homeserver: error: ")]
    assert len(errors) == 1 and errors[0] == text.splitlines()[-1], text
    assert errors[0].startswith(f"homeserver: error: sessions.sqlite.path: {layout.etc}/sessions.db: "), text
    assert "not writable" in errors[0]
