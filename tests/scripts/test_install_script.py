"""scripts/install-test-services.sh asks apt for what is missing, Node.js and npm included."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "install-test-services.sh"


def stub(folder: Path, name: str, body: str = "exit 0") -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def run_script(tmp_path: Path, present: list[str]) -> tuple[int, list[str]]:
    """Run the script on a PATH of stubs: `present` programs exist; apt-get, sudo, mkdir and
    touch (and the rest the script runs) only record or do nothing. Returns the exit status and what apt-get install got."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "id", "cat", "dirname"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    calls = tmp_path / "apt-calls"
    stub(bin_dir, "apt-get", f'echo "$@" >> {calls}')
    stub(bin_dir, "sudo", '"$@"')
    # python3 stands in for the Synapse virtualenv step; tee, chmod and rm for policy-rc.d.
    for name in ("mkdir", "touch", "tee", "chmod", "rm", "python3", *present):
        stub(bin_dir, name)
    proc = subprocess.run(
        [str(bin_dir / "bash"), str(SCRIPT)], env={"PATH": str(bin_dir)}, capture_output=True, text=True, timeout=60
    )
    installs = [line for line in (calls.read_text().splitlines() if calls.exists() else []) if "install" in line]
    return proc.returncode, installs


def test_node_and_npm_are_installed_when_missing(tmp_path):
    code, installs = run_script(tmp_path, ["redis-server", "slapd", "ldapwhoami", "openssl"])
    assert code == 0
    assert len(installs) == 1
    packages = installs[0].split()
    assert "nodejs" in packages and "npm" in packages
    assert "redis-server" not in packages and "openssl" not in packages


def test_present_node_and_npm_are_left_alone(tmp_path):
    code, installs = run_script(tmp_path, ["redis-server", "slapd", "ldapwhoami", "openssl", "node", "npm", "curl"])
    assert code == 0
    assert all("nodejs" not in line.split() and "npm" not in line.split() for line in installs), installs
