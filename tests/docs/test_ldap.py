"""docs/ldap.md's "A directory to try it on", run as written: option B (a private slapd of
the user's own, on a free port instead of 3389) and every step after it, in one bash, from
the repository's folder, with HOME in a temporary folder. Then this server runs on the
config the recipe wrote, alice logs in, and the recipe's lock and unlock reach her token.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.doc_blocks import code_blocks, section, shell_commands
from tests.support.helpers import JWT_SECRET, ci, record
from tests.support.servers import WHOAMI, Server, call, login
from tests.support.slapd import _tool, free_port, ppolicy_available, require_slapd

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ldap.md"
PROFILE = "/_matrix/client/v3/profile/@alice:localhost"


def recipe() -> dict[str, Any]:
    blocks = code_blocks(section(DOC.read_text(), "A directory to try it on"), "sh")
    for block in blocks:
        shell_commands(block)  # each block splits into whole commands (no unfinished here-doc)
    system = [b for b in blocks if "apt-get install" in b]
    private = [b for b in blocks if "slapadd" in b]
    lock = [b for b in blocks if "replace: pwdAccountLockedTime" in b]
    unlock = [b for b in blocks if "delete: pwdAccountLockedTime" in b]
    assert len(system) == len(private) == len(lock) == len(unlock) == 1, blocks
    after = blocks[blocks.index(private[0]) + 1:]
    return {
        "system": system[0],
        "private": private[0],
        "steps": [b for b in after if b not in (lock[0], unlock[0])],
        "lock": lock[0],
        "unlock": unlock[0],
    }


def run(script: str, home: Path, log: Path, typed: str = "") -> None:
    """One bash, as a reader's terminal, `typed` what the reader types at its prompts (the one
    reader of standard input: hash-password); output to a file (slapd, started in it, keeps no pipe)."""
    with open(log, "w") as out:
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=ROOT, stdout=out,
                              stderr=subprocess.STDOUT, input=typed.encode(), timeout=120,
                              env={**os.environ, "HOME": str(home)})
    assert done.returncode == 0, f"{script}\n---\n{log.read_text()}"


def variables_used(*blocks: str) -> list[str]:
    return sorted({name for block in blocks for name in re.findall(r"\$\{?([A-Z_]+)", block)})


@pytest.fixture
def directory(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The recipe's private slapd and entries; (home, the folder D, the variables' file)."""
    require_slapd()
    for tool in ("slappasswd", "ldapmodify", "ldapadd"):
        if _tool(tool) is None:
            (pytest.fail if ci() else pytest.skip)(f"{tool} is not installed (scripts/install-test-services.sh)")
    if not ppolicy_available():
        (pytest.fail if ci() else pytest.skip)("slapd's ppolicy overlay is not installed")
    if not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("the recipe uses the README's .venv, which is not made here (scripts/test.sh makes it)")
    parts = recipe()
    home = tmp_path / "home"
    home.mkdir()
    assert len(re.findall(r"\bPORT=3389\b", parts["private"])) == 1
    private = parts["private"].replace("PORT=3389", f"PORT={free_port()}")
    names = variables_used(parts["lock"], parts["unlock"])
    assert {"LDAP_URI", "ADMIN_DN", "ADMIN_PW"} <= set(names), names
    saved = tmp_path / "variables.sh"
    keep = "".join(f"printf '%s=%q\\n' {name} \"${name}\" >> {shlex.quote(str(saved))}\n" for name in names)
    folder = home / "ldap-try"
    try:
        run("\n".join([private, *parts["steps"], keep]), home, tmp_path / "recipe.log", typed="wonderland\n")
        yield {"home": home, "folder": folder, "variables": saved.read_text(), "log": tmp_path / "recipe.log",
               "parts": parts}
    finally:
        with_pid = folder / "slapd.pid"
        if with_pid.exists():
            pid = int(with_pid.read_text().split()[0])
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
                time.sleep(0.05)


def whoami_until(port: int, token: str, expected: int) -> tuple[int, Any]:
    deadline = time.monotonic() + 15
    while True:
        status, body = call(port, WHOAMI, token=token)
        if status == expected or time.monotonic() > deadline:
            return status, body
        time.sleep(0.2)


def test_the_recipe_makes_a_directory_this_server_logs_in_against_and_locks(directory):
    home, folder, log = directory["home"], directory["folder"], directory["log"]
    output = log.read_text()
    # The check step: the service account sees alice with her hash and her entryUUID.
    assert "dn: uid=alice,ou=people,dc=example,dc=org" in output and "entryUUID: " in output, output
    assert re.search(r"^userPassword::? ", output, re.MULTILINE), output
    assert (folder / "ldap.pw").stat().st_mode & 0o077 == 0

    # The ACL as the doc says: nobody but the service account (and alice) sees the people.
    anonymous = subprocess.run([_tool("ldapsearch"), "-x", "-LLL", "-H", uri(directory), "-b",
                                "ou=people,dc=example,dc=org", "(uid=alice)"], capture_output=True, text=True)
    assert anonymous.returncode in (0, 32) and "uid=alice" not in anonymous.stdout, anonymous.stdout

    server = Server("--config", str(folder / "homeserver.toml"))
    try:
        status, answer = login(server.port, "alice", "wonderland")
        assert status == 200 and answer["user_id"] == "@alice:localhost", (status, answer)
        token = answer["access_token"]
        assert login(server.port, "alice", "not-her-password")[0] == 403
        # The recipe's ident: the uid in brackets, not the entryUUID glued on.
        assert call(server.port, PROFILE) == (200, {"displayname": "Alice (alice)"})

        run(directory["variables"] + directory["parts"]["lock"], home, log)
        status, body = whoami_until(server.port, token, 401)
        assert (status, body.get("errcode"), body.get("soft_logout")) == (401, "M_USER_LOCKED", True), body

        run(directory["variables"] + directory["parts"]["unlock"], home, log)
        status, body = whoami_until(server.port, token, 200)
        assert status == 200 and body["user_id"] == "@alice:localhost", body
    finally:
        server.stop()


def uri(directory: dict[str, Any]) -> str:
    return re.search(r"^LDAP_URI=(\S+)$", directory["variables"], re.MULTILINE).group(1)  # type: ignore[union-attr]


def test_the_system_way_uses_the_same_variables():
    """Option A (Debian's system slapd, not run here: it needs root and port 389) sets every
    variable the shared steps use, as option B does."""
    parts = recipe()
    shared = set(variables_used(*parts["steps"], parts["lock"], parts["unlock"]))
    set_here = set(re.findall(r"^([A-Z_]+)=", parts["system"], re.MULTILINE))
    set_there = set(re.findall(r"(?:^|; )([A-Z_]+)=", parts["private"], re.MULTILINE))
    made_by_steps = set(re.findall(r"^([A-Z_]+)=", "\n".join(parts["steps"]), re.MULTILINE))
    assert shared - made_by_steps <= set_here, sorted(shared - made_by_steps - set_here)
    assert shared - made_by_steps <= set_there, sorted(shared - made_by_steps - set_there)
    assert "debconf-set-selections" in parts["system"] and "apt-get install -y slapd ldap-utils" in parts["system"]


def test_switching_a_running_server_keeps_its_sessions(directory, tmp_path):
    """"Switching a running server to the directory" as printed: a server on a users file
    (alice with another password than the directory's, and bob, who is not in it), its
    config kept and its [backend] sections replaced by the recipe's, the two adopt commands;
    on the directory, alice's token still works and bob's does not."""
    home, folder, log = directory["home"], directory["folder"], directory["log"]
    running = tmp_path / "running"
    running.mkdir()
    users = [record("alice", "her-old-password", " [alice]", display_name="Alice"), record("bob", "builder")]
    (running / "users.json").write_text(json.dumps({"users": users}))
    conf = running / "homeserver.toml"
    conf.write_text(f'[auth]\njwt_secret = "{JWT_SECRET}"\n[rate_limit]\nenabled = false\n'
                    '[backend]\ntype = "file"\n[backend.file]\npath = "users.json"\n')
    server = Server("--config", str(conf))
    try:
        status, alice = login(server.port, "alice", "her-old-password")
        assert status == 200, alice
        status, bob = login(server.port, "bob", "builder")
        assert status == 200, bob
    finally:
        server.stop()

    first, second = code_blocks(section(DOC.read_text(), "Switching a running server"), "sh")
    assert first.count("/etc/homeserver/homeserver.toml") == 1
    first = first.replace("/etc/homeserver/homeserver.toml", str(conf))
    run(first, home, log)
    assert (running / "homeserver.toml.before-ldap").read_text() == conf.read_text()
    # The edit step 1 describes: the [backend] sections replaced by the recipe's, the rest kept.
    text = conf.read_text()
    conf.write_text(text[: text.index("[backend]")] + (folder / "homeserver.toml").read_text())
    run(f"CONFIG={shlex.quote(str(conf))}\n{second}", home, log)
    said = log.read_text()
    assert "@alice:localhost: 1 session to carry over" in said, said
    assert "@bob:localhost: not in the new user store" in said, said
    assert "Carried 1 session of 1 user over to the new user store." in said, said

    server = Server("--config", str(conf))
    try:
        status, me = call(server.port, WHOAMI, token=alice["access_token"])
        assert (status, me.get("user_id")) == (200, "@alice:localhost"), me
        assert call(server.port, WHOAMI, token=bob["access_token"])[0] == 401
        assert call(server.port, PROFILE) == (200, {"displayname": "Alice (alice)"})
        assert login(server.port, "alice", "wonderland")[0] == 200  # the directory's password now
    finally:
        server.stop()
