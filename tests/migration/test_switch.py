"""docs/migration.md followed as printed on a test deployment: a real Synapse with its own passwords
(a pepper, one password NFKC changes), admin, deactivated and locked users, refresh tokens and
matrix-synapse-ldap3 on the test slapd, clients logged in on several devices with their keys and an
encrypted room (matrix-nio with libolm); then the doc's commands, one by one, in bash, from this
server's folder (only its paths and addresses replaced; `systemctl` done by the test: Synapse,
this server and nginx are its processes), and after the switch, through nginx with
conf/nginx-delegation.conf: the same tokens work with the same user and device, refresh works
and a replayed refresh token is refused, `/sync` goes on from its `since`, new messages decrypt on
the old devices with their keys unchanged, local users log in with their old passwords, the
states hold; then its way back. On SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from tests.support.doc_blocks import code_blocks, section, shell_commands
from tests.support.helpers import ci
from tests.support.nginx import Nginx, NginxUnavailable
from tests.support.nio_e2e import NioUnavailable, nio_python
from tests.support.openapi import validate_error
from tests.support.synapse import SynapseUnavailable, free_port, http, synapse_python
from tests.support.synapse_before import PASSWORDS, SynapseBefore, make_state

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "migration.md"
NIO_SCRIPT = ROOT / "tests" / "nio" / "migration_e2ee.py"
WHOAMI = "/_matrix/client/v3/account/whoami"
SYSTEMCTL = re.compile(r"^(?:nginx -t && )?systemctl (start|stop|reload) (.+)$")


def unavailable(exc: Exception) -> None:
    if ci():
        pytest.fail(f"{exc} (CI is set: the switch must be tested)")
    pytest.skip(str(exc))


class Homeserver:
    """This server as a process of its own (`systemctl start homeserver`)."""

    def __init__(self, config: Path, port: int) -> None:
        self.config, self.url, self.proc = config, f"http://127.0.0.1:{port}", None
        self.log = config.parent / "homeserver.log"

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "run.py", "--config", str(self.config)], cwd=ROOT,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                if http(self.url + "/_matrix/client/versions", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            assert time.monotonic() < deadline, self.log.read_text()[-3000:]
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)
        self.proc = None


class Deployment:
    """Synapse (before: its own logins; after: behind this server), this server, nginx."""

    def __init__(self, folder: Path, kind: str, slapd_uri: str, cluster: Any) -> None:
        self.folder, self.kind, self.cluster = folder, kind, cluster
        self.nginx_port, self.hs_port, self.synapse_port = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.nginx_port}"
        database = None
        if kind == "postgres":
            cluster.create_database("synapse")
            database = {"name": "psycopg2", "args": {**cluster.args("synapse"), "cp_min": 1, "cp_max": 5}}
        self.synapse = SynapseBefore(folder / "synapse", database=database, ldap_uri=slapd_uri,
                                     port=self.synapse_port, public_baseurl=self.url + "/")
        (folder / "hs").mkdir()
        (folder / "hs" / "users.json").write_text('{"users": []}')
        self.config = folder / "hs" / "homeserver.toml"
        self.config.write_text(
            f'[server]\nhost = "127.0.0.1"\nport = {self.hs_port}\nbase_url = "{self.url}"\n'
            'server_name = "localhost"\ntrusted_proxies = ["127.0.0.1/32"]\n'
            '[backend.file]\npath = "users.json"\nreload_interval = 0.2\n[rate_limit]\nenabled = false\n'
        )
        self.homeserver = Homeserver(self.config, self.hs_port)
        self.nginx: Nginx | None = None

    def settings(self) -> str:
        """The doc's settings block, with this deployment's paths."""
        hs = self.folder / "hs"
        return "\n".join([
            f"SYNAPSE_CONFIG={self.synapse.config_path}",
            f"SYNAPSE_DB={self.synapse.folder / 'homeserver.db'}",
            f"SYNAPSE_PYTHON={synapse_python()}",
            f"HOMESERVER_CONFIG={self.config}",
            f"HOMESERVER_URL={self.homeserver.url}/",
            f"SHARED_SECRET={hs / 'synapse.secret'}",
            f"PEPPER_FILE={hs / 'synapse-pepper'}",
        ])

    def our_toml(self, block: str) -> str:
        """The doc's lines for this server's config, with this deployment's paths and addresses."""
        hs = self.folder / "hs"
        return (block.replace("/etc/homeserver/synapse-pepper", str(hs / "synapse-pepper"))
                .replace("/etc/homeserver/synapse.secret", str(hs / "synapse.secret"))
                .replace("http://127.0.0.1:8008", self.synapse.url))

    def systemctl(self, action: str, units: str) -> None:
        for unit in units.split():
            if unit == "nginx":
                if self.nginx is None:
                    try:
                        self.nginx = Nginx(self.folder / "nginx", self.nginx_port, self.hs_port, self.synapse_port)
                    except NginxUnavailable as exc:
                        unavailable(exc)
            elif unit == "matrix-synapse":
                self.synapse.stop() if action == "stop" else self.synapse.start()
            elif unit == "homeserver":
                self.homeserver.stop() if action == "stop" else self.homeserver.start()
            else:
                raise AssertionError(f"the doc names a unit this test does not run: {unit}")

    def stop(self) -> None:
        if self.nginx is not None:
            self.nginx.stop()
        self.homeserver.stop()
        self.synapse.stop()

    def bash(self, command: str) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ)
        if self.kind == "postgres":
            env.update(PGHOST="127.0.0.1", PGPORT=str(self.cluster.port), PGUSER="postgres",
                       PATH=f"{self.cluster.bin}:{env['PATH']}")
        script = self.settings() + "\n" + command
        return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, capture_output=True, text=True,
                              timeout=300, env=env)

    def follow(self, commands: list[str]) -> dict[str, subprocess.CompletedProcess[str]]:
        """The doc's commands in order; what each printed, by command."""
        done = {}
        for command in commands:
            service = SYSTEMCTL.match(command)
            if service:
                self.systemctl(*service.groups())
                continue
            if self.kind == "postgres" and '"$SYNAPSE_DB"' in command:
                # The doc's PostgreSQL way, from its prose, in place of the SQLite file's copy.
                command = re.search(r"`(pg_dump [^`]+)`", " ".join(DOC.read_text().split())).group(1)
                command = command.replace("--file=", f"--file={self.folder}/")
            result = self.bash(command)
            assert result.returncode in ((0, 1) if "migrate-synapse check" in command else (0,)), (
                f"{command}\n{result.stdout}\n{result.stderr}")
            done[command] = result
        return done


def nio(phase: str, python: Path, url: str, store: Path) -> dict[str, Any]:
    done = subprocess.run([str(python), str(NIO_SCRIPT), phase, url, str(store)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def doc_commands(heading: str) -> list[str]:
    return [c for block in code_blocks(section(DOC.read_text(), heading), "sh") for c in shell_commands(block)]


@pytest.fixture(params=["sqlite", "postgres"])
def deployment(request, tmp_path, slapd):
    try:
        nio_python()
        synapse_python()
    except (NioUnavailable, SynapseUnavailable) as exc:
        unavailable(exc)
    cluster = request.getfixturevalue("postgres_cluster") if request.param == "postgres" else None
    made = Deployment(tmp_path, request.param, slapd.uri, cluster)
    yield made
    made.stop()
    if cluster is not None:
        cluster.drop_database("synapse")


def test_the_switch_as_the_doc_says(deployment: Deployment, tmp_path: Path) -> None:
    stack = deployment
    nio_store = tmp_path / "nio"
    try:
        stack.synapse.start()
    except SynapseUnavailable as exc:
        unavailable(exc)
    state = make_state(stack.synapse)
    before = nio("before", nio_python(), stack.synapse.url, nio_store)
    assert before["seen"]["bob"]["decrypted"] and before["seen"]["alice_b"]["decrypted"], before
    # "Start this server once and stop it again."
    stack.homeserver.start()
    stack.homeserver.stop()

    # Before the day: the settings block is this deployment's (Deployment.settings), then the rest.
    before_day = doc_commands("Before the day")
    assert before_day[0].startswith("SYNAPSE_CONFIG="), before_day[0]
    [toml] = code_blocks(section(DOC.read_text(), "Before the day"), "toml")
    stack.config.write_text(stack.config.read_text() + stack.our_toml(toml))
    stack.follow(before_day[1:])

    # On the day, every command as printed; the dry run writes nothing.
    day = doc_commands("On the day")
    dry = next(c for c in day if "--dry-run" in c)
    ours_before_dry: dict[str, bytes] = {}

    def snapshot(folder: Path) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}

    done = {}
    synapse_files: dict[str, bytes] = {}
    for command in day:
        if command == dry:
            ours_before_dry = snapshot(stack.folder / "hs")
        done.update(stack.follow([command]))
        if command == dry:
            assert snapshot(stack.folder / "hs") == ours_before_dry, "the dry run wrote something"
        if command == "systemctl stop matrix-synapse":
            synapse_files = snapshot(stack.synapse.folder)
        if "migrate-synapse run" in command and "--dry-run" not in command:
            # Synapse's database (SQLite's file; no -wal or -shm made beside it) was only read.
            databases = {n: b for n, b in synapse_files.items() if ".db" in n}
            assert {n: b for n, b in snapshot(stack.synapse.folder).items() if n in databases or n.endswith(
                ("-wal", "-shm"))} == databases
    run = next(result for command, result in done.items() if "migrate-synapse run" in command and "--dry" not in command)
    assert "users: 5 users moved (5 added to the file user store) of 7 read" in run.stdout, run.stdout
    assert state.pepper not in run.stdout

    _after_the_switch(stack, state, nio_store)
    _going_back(stack, state)


def _after_the_switch(stack: Deployment, state, nio_store: Path) -> None:
    # The same tokens, through nginx: the same user and device (dave is locked: refused).
    for name, session in state.sessions.items():
        status, answer = http(stack.url + WHOAMI, token=session.access_token)
        if name == "dave":
            assert (status, answer["errcode"]) == (401, "M_UNKNOWN_TOKEN"), answer
        elif name == "grace":
            assert status == 401  # matrix-synapse-ldap3's user: no password here in a users file
        elif name == "alice_laptop" and status == 401:
            assert answer["soft_logout"] is True  # its access token expired meanwhile: refreshed below
        else:
            assert (status, answer["user_id"], answer["device_id"]) == (
                200, f"@{session.user}:localhost", session.device_id), (name, answer)
    # The encrypted room goes on: incremental syncs from their `since`, new messages decrypted on
    # the old devices, the keys everyone sees unchanged (no new device, no new verification).
    after = nio("after", nio_python(), stack.url, nio_store)
    assert after["whoami"] == {"alice_a": ["@alice:localhost", "ALICENIOA"],
                               "alice_b": ["@alice:localhost", "ALICENIOB"], "bob": ["@bob:localhost", "BOBNIO"]}
    # (An initial sync would give the room's timeline again, "before the move" in it.)
    assert all(v == {"next_batch": True, "old_messages_again": 0} for v in after["went_on"].values()), after
    assert after["after"]["alice_a"] == after["after"]["alice_b"] == {
        "body": "after the move", "sender": "@bob:localhost", "decrypted": True}, after
    assert after["reply"] == {"body": "and back, after", "sender": "@alice:localhost", "decrypted": True}, after
    assert all(after["keys_unchanged"].values()) and all(after["keys_after"].values()), after
    # Refresh: erin's tablet refreshes here; its new access token works at Synapse on the same
    # device; the refresh token used again after that is a replay: refused, the session ended.
    tablet = state.sessions["erin_tablet"]
    refresh = "/_matrix/client/v3/refresh"
    status, fresh = http(stack.url + refresh, {"refresh_token": tablet.refresh_token})
    assert status == 200 and set(fresh) == {"access_token", "refresh_token", "expires_in_ms"}, fresh
    assert http(stack.url + WHOAMI, token=fresh["access_token"])[1]["device_id"] == "ERINTABLET"
    status, replay = http(stack.url + refresh, {"refresh_token": tablet.refresh_token})
    assert (status, replay["errcode"], replay["soft_logout"]) == (401, "M_UNKNOWN_TOKEN", False), replay
    assert http(stack.url + WHOAMI, token=fresh["access_token"])[0] == 401
    laptop = state.sessions["alice_laptop"]
    status, renewed = http(stack.url + refresh, {"refresh_token": laptop.refresh_token})
    assert status == 200 and http(stack.url + WHOAMI, token=renewed["access_token"])[1]["device_id"] == "ALICELAPTOP"
    # Local users log in with the passwords they had (Synapse's pepper, NFKC); the states hold.
    login = "/_matrix/client/v3/login"

    def password_login(user: str, password: str) -> tuple[int, Any]:
        return http(stack.url + login, {"type": "m.login.password", "password": password,
                                        "identifier": {"type": "m.id.user", "user": user}})

    for user, password in (("root", PASSWORDS["root"]), ("alice", "fish and chips"), ("erin", PASSWORDS["erin"])):
        status, answer = password_login(user, password)
        assert status == 200, (user, answer)
        assert http(stack.url + WHOAMI, token=answer["access_token"])[0] == 200
    status, locked = password_login("dave", PASSWORDS["dave"])
    assert (status, locked["errcode"]) == (401, "M_USER_LOCKED"), locked
    status, refused = password_login("carol", PASSWORDS["carol"])
    assert status == 403, refused
    # root is an admin at Synapse with his old token: its admin API answers him.
    root = state.sessions["root"].access_token
    user_id = urllib.parse.quote("@alice:localhost")
    status, alice = http(f"{stack.synapse.url}/_synapse/admin/v2/users/{user_id}", token=root)
    assert status == 200 and alice["displayname"] == "Alice Liddell", alice
    status, devices = http(f"{stack.synapse.url}/_synapse/admin/v2/users/{user_id}/devices", token=root)
    assert {"ALICEPHONE", "ALICELAPTOP", "ALICENIOA", "ALICENIOB"} <= {d["device_id"] for d in devices["devices"]}
    # A logout here ends the device at Synapse at once (the imported session like any other).
    phone = state.sessions["alice_phone"].access_token
    assert http(stack.url + "/_matrix/client/v3/logout", {}, token=phone)[0] == 200
    status, gone = http(stack.url + WHOAMI, token=phone)
    assert status == 401
    validate_error_body(gone)


def validate_error_body(body: Any) -> None:
    from tests.support.helpers import Response

    validate_error(Response(401, {}, json.dumps(body).encode()))


def _going_back(stack: Deployment, state) -> None:
    """The doc's way back: Synapse checks its own tokens again."""
    stack.follow(doc_commands("If it goes wrong"))
    bob = state.sessions["bob"]
    status, answer = http(stack.synapse.url + WHOAMI, token=bob.access_token)
    assert (status, answer["device_id"]) == (200, "BOBPHONE"), answer
    # alice's phone was logged out meanwhile: Synapse deleted that device, its token is gone.
    assert http(stack.synapse.url + WHOAMI, token=state.sessions["alice_phone"].access_token)[0] == 401
