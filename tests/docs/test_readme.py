"""The README as a new operator follows it: its curl sessions run as shown, its sample token
is shaped like a real one, its code-layout table names the modules."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.helpers import ci
from tests.support.servers import Server

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def console_blocks() -> list[str]:
    return re.findall(r"```console\n(.*?)```", README, re.DOTALL)


def commands_and_outputs(block: str) -> list[tuple[str, str]]:
    """Each `$ ` command (with its continuation lines) and the output shown under it."""
    pairs: list[tuple[str, str]] = []
    command: list[str] = []
    output: list[str] = []
    continuing = False
    for line in block.splitlines():
        if line.startswith("$ ") and not continuing:
            if command:
                pairs.append(("\n".join(command), "\n".join(output).strip()))
            command, output = [line[2:]], []
            continuing = line.endswith("\\") or line.count("'") % 2 == 1
        elif continuing:
            command.append(line)
            text = "\n".join(command)
            continuing = line.endswith("\\") or text.count("'") % 2 == 1
        else:
            output.append(line)
    if command:
        pairs.append(("\n".join(command), "\n".join(output).strip()))
    return pairs


def b64(part: str) -> dict:
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))


def test_the_sample_token_is_shaped_like_a_real_one():
    block = console_blocks()[0]
    token = re.search(r'"access_token":"([^"]+)"', block).group(1)
    header, claims, signature = token.split(".")
    assert b64(header)["alg"] == "HS256" and b64(header)["nonce"]
    assert b64(claims) == {"sub": "alice", "device_id": "DUMMY"}
    assert len(base64.urlsafe_b64decode(signature + "=")) == 32
    assert "..." not in token


@pytest.fixture
def shipped_server(tmp_path):
    if shutil.which("curl") is None:
        if ci():
            pytest.fail("curl is needed to run the README's sessions")
        pytest.skip("curl is not installed")
    env = {
        **os.environ,
        "HOMESERVER_AUTH__SECRET_FILE": str(tmp_path / "secret"),
        "HOMESERVER_SESSIONS__SQLITE__PATH": str(tmp_path / "sessions.db"),
        "HOMESERVER_RATE_LIMIT__ENABLED": "false",  # the README's logins, in a row, from one address
    }
    server = Server(env=env)
    yield server
    server.stop()


def comparable(text: str) -> str:
    return re.sub(r'"last_seen_ts":\d+', '"last_seen_ts":0', text)


@pytest.mark.parametrize("index", [0, 1], ids=["first-session", "device-deletion"])
def test_the_curl_sessions_run_as_shown(shipped_server, index):
    """Pasted into bash (one shell, so TOKEN and SESSION carry over), every command
    prints what the README shows, where it shows it whole."""
    pairs = commands_and_outputs(console_blocks()[index])
    assert len(pairs) >= 4
    marker = "=====README-NEXT====="
    script = "\n".join(f"{command}\necho; echo {marker}" for command, _ in pairs)
    script = script.replace("127.0.0.1:8008", f"127.0.0.1:{shipped_server.port}")
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    outputs = [part.strip() for part in proc.stdout.split(marker)][: len(pairs)]
    assert len(outputs) == len(pairs), proc.stdout
    checked = 0
    for (command, shown), got in zip(pairs, outputs, strict=True):
        if "..." in shown or "access_token" in shown:
            continue  # shortened in the README, or a fresh token
        assert comparable(got) == comparable(shown), command
        checked += 1
    assert checked >= 3


def test_the_code_layout_table_names_every_module():
    section = README.split("## Code layout", 1)[1].split("\n## ", 1)[0]
    table = "\n".join(line for line in section.splitlines() if line.startswith("| "))
    named = set(re.findall(r"([a-z0-9_]+\.py)", table))
    modules = {p.name for p in (ROOT / "homeserver").glob("*.py") if p.name != "__init__.py"}
    modules |= {"base.py", "body.py"}  # handlers/: the shared parts (endpoint modules are per group)
    assert modules <= named, sorted(modules - named)


def test_ci_runs_the_readmes_test_command_which_installs_what_is_missing():
    """A fresh machine needs the README's one command: CI runs exactly it, and it installs the
    services the tests start (scripts/install-test-services.sh --if-allowed) before anything."""
    block = README.split("Run the whole test suite", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    command = block.strip()
    assert command == "scripts/test.sh"
    ci_lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci_lines[-1] == f"exec {command}"
    assert not any("install-test-services" in line for line in ci_lines)  # the command does it
    script = (ROOT / "scripts" / "test.sh").read_text()
    steps = [line for line in script.splitlines() if line and not line.startswith("#")]
    install = steps.index("scripts/install-test-services.sh --if-allowed")
    assert install < next(i for i, line in enumerate(steps) if "-m venv" in line)  # python3-venv first
    assert "Extra arguments go to pytest" in README and "--quick" in README
