"""scripts/install-test-services.sh asks apt for what is missing, Node.js and npm included; with
--if-allowed (scripts/test.sh) only as root or with sudo that asks no password, else one line."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "install-test-services.sh"


def stub(folder: Path, name: str, body: str = "exit 0") -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def run_script(
    tmp_path: Path, present: list[str], *args: str, uid: int = 0, sudo_asks: bool = False, apt: bool = True
) -> tuple[int, list[str]]:
    """Run the script on a PATH of stubs: `present` programs exist; apt-get, sudo, mkdir and
    touch (and the rest the script runs) only record or do nothing; `id -u` says `uid`, and
    `sudo -n` fails when `sudo_asks` (a password would be needed). Returns the exit status and
    what apt-get install got."""
    code, installs, _ = run_script_full(tmp_path, present, *args, uid=uid, sudo_asks=sudo_asks, apt=apt)
    return code, installs


def run_script_full(
    tmp_path: Path, present: list[str], *args: str, uid: int = 0, sudo_asks: bool = False, apt: bool = True,
    apt_fails: bool = False,
) -> tuple[int, list[str], subprocess.CompletedProcess[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "cat", "dirname", "mktemp", "grep", "tail"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    stub(bin_dir, "id", f"echo {uid}")
    calls = tmp_path / "apt-calls"
    if apt:
        fail = 'echo "E: Unable to locate package curl" >&2; exit 100' if apt_fails else ""
        stub(bin_dir, "apt-get", f'echo "$@" >> {calls}\n[ "$1" = install ] && {{ {fail or ":"}; }}\nexit 0')
    asks = '[ "$1" = -n ] && exit 1\n' if sudo_asks else '[ "$1" = -n ] && shift\n'
    stub(bin_dir, "sudo", asks + f'echo "sudo $*" >> {tmp_path / "sudo-calls"}\n"$@"')
    # python3 stands in for the Synapse virtualenv step; tee, chmod and rm for policy-rc.d.
    stub(bin_dir, "python3", f'echo "$@" >> {tmp_path / "python3-calls"}')
    for name in ("mkdir", "touch", "tee", "chmod", "rm", *present):
        stub(bin_dir, name)
    proc = subprocess.run(
        [str(bin_dir / "bash"), str(SCRIPT), *args], env={"PATH": str(bin_dir), "TMPDIR": str(tmp_path)},
        capture_output=True, text=True,
        timeout=60,
    )
    installs = [line for line in (calls.read_text().splitlines() if calls.exists() else []) if "install" in line]
    return proc.returncode, installs, proc


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


ALL = ["redis-server", "slapd", "ldapwhoami", "openssl", "chromium", "chromedriver", "node", "npm", "curl", "nginx"]


def test_if_allowed_without_root_or_passwordless_sudo_says_what_to_run(tmp_path):
    code, installs, proc = run_script_full(tmp_path, ["redis-server"], "--if-allowed", uid=1000, sudo_asks=True)
    assert code == 0 and installs == []
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "ldap-utils" in lines[0] and "curl" in lines[0], proc.stderr
    assert lines[0].endswith("to install them: sudo scripts/install-test-services.sh")
    assert not (tmp_path / "sudo-calls").exists()  # sudo -n only: nothing asked for a password


@pytest.mark.parametrize("uid, sudo_asks", [(0, True), (1000, False)], ids=["root", "passwordless-sudo"])
def test_if_allowed_installs_as_root_or_with_passwordless_sudo(tmp_path, uid, sudo_asks):
    code, installs, proc = run_script_full(tmp_path, ["redis-server"], "--if-allowed", uid=uid, sudo_asks=sudo_asks)
    assert code == 0, proc.stderr
    assert len(installs) == 1 and "curl" in installs[0].split() and "redis-server" not in installs[0].split()
    assert (tmp_path / "python3-calls").read_text().count("tests/support/synapse.py install") == 1


def test_if_allowed_an_install_that_fails_is_one_line_and_the_tests_run(tmp_path):
    """No network or a broken mirror: scripts/test.sh goes on to the tests (those needing what
    is missing are skipped, failed under CI) after one line naming the error and the log."""
    code, installs, proc = run_script_full(tmp_path, ["redis-server"], "--if-allowed", uid=0, apt_fails=True)
    assert code == 0 and len(installs) == 1
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("installing what the tests need:") and len(lines) == 2, proc.stderr
    assert lines[1].startswith("could not install ") and "E: Unable to locate package curl" in lines[1]
    log = lines[1].rsplit("all of it: ", 1)[1]
    assert Path(log).parent == tmp_path and "Unable to locate package" in Path(log).read_text()
    python3_calls = tmp_path / "python3-calls"
    assert "synapse.py install" not in (python3_calls.read_text() if python3_calls.exists() else "")


def test_if_allowed_without_apt_says_what_to_run(tmp_path):
    code, installs, proc = run_script_full(tmp_path, ["redis-server"], "--if-allowed", uid=0, apt=False)
    assert code == 0 and installs == []
    assert "to install them: sudo scripts/install-test-services.sh" in proc.stderr


def test_if_allowed_with_nothing_missing_is_silent(tmp_path):
    if subprocess.run(["/usr/bin/python3", "-c", "import olm"], capture_output=True).returncode != 0:
        pytest.skip("python3-olm is missing on this machine (the script checks /usr/bin/python3 itself)")
    code, installs, proc = run_script_full(tmp_path, ALL, "--if-allowed", uid=1000, sudo_asks=True)
    assert (code, installs, proc.stderr) == (0, [], "")
    # Synapse's virtualenv is left to the tests that need it: no PyPI at every run.
    assert "tests/support/synapse.py install" not in ((tmp_path / "python3-calls").read_text()
                                              if (tmp_path / "python3-calls").exists() else "")


def test_an_unknown_argument_is_refused(tmp_path):
    code, installs, proc = run_script_full(tmp_path, [], "--yes")
    assert code == 2 and installs == [] and "usage:" in proc.stderr
