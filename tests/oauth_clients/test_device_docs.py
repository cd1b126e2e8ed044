"""docs/oauth.md's device flow walk-through, run as written (bash, curl, jq) against a server,
the person's approval done over HTTP while the block polls."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.oauth_clients.device_person import HttpPerson
from tests.support.helpers import ci

DOC = Path(__file__).resolve().parent.parent.parent / "docs" / "oauth.md"


def walkthrough() -> str:
    text = DOC.read_text()
    block = re.search(r"<!-- device-flow -->\n```sh\n(.*?)```", text, re.S)
    assert block is not None, "docs/oauth.md lost its device-flow block"
    return block.group(1)


def test_the_device_flow_walkthrough_runs(oauth_server):
    missing = [tool for tool in ("bash", "curl", "jq") if shutil.which(tool) is None]
    if missing:
        if ci():
            pytest.fail(f"the walk-through needs {missing}")
        pytest.skip(f"{missing} not installed")
    script = walkthrough()
    assert script.startswith("SERVER=https://matrix.example.org\n")
    script = f"set -e\nSERVER=http://127.0.0.1:{oauth_server.port}\n" + script.split("\n", 1)[1]
    proc = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        first = proc.stdout.readline()
        shown = re.fullmatch(r"Open (http://\S+/account/device) and type ([A-Z]{4}-[A-Z]{4})\n", first)
        assert shown, first
        # Approved as a person would, a moment later (the block polls meanwhile): the
        # verification URI, the sign-in, the code typed in lower case.
        time.sleep(1.5)
        assert proc.poll() is None
        done = HttpPerson().approve(shown.group(1), shown.group(2).lower())
        assert "TERMINAL01" in done and "My terminal client" in done
        started = time.monotonic()
        out, err = proc.communicate(timeout=60)
        assert time.monotonic() - started > 2  # the block waited its interval before polling again
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    lines = out.splitlines()
    assert '"user_id":"@alice:localhost"' in lines[0].replace(" ", "") and '"TERMINAL01"' in lines[0], out
    assert lines[1] == "Bearer", out
