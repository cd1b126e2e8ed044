"""`run.py add-user` on the users file, as an operator runs it: replace, ownership, no lock file."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import bcrypt
import pytest

from tests.cli.test_cli import ROOT, run


def users(tmp_path):
    return {u["name"]: u for u in json.loads((tmp_path / "users.json").read_text())["users"]}


def add(conf, *args, password="pw\n"):
    return run("add-user", *args, "--config", str(conf), stdin=password)


def test_overwrite_changes_what_is_given_and_keeps_the_rest(conf, tmp_path):
    assert add(conf, "ann", "--ident", " (a)", "--display-name", "Ann", "--avatar-url", "mxc://x/a").stdout == (
        "added @ann:localhost\n"
    )
    result = add(conf, "ann", "--overwrite", "--display-name", "Ann B.", password="new\n")
    assert (result.returncode, result.stdout, result.stderr) == (0, "replaced @ann:localhost\n", "")
    ann = users(tmp_path)["ann"]
    assert (ann["ident"], ann["display_name"], ann["avatar_url"]) == (" (a)", "Ann B.", "mxc://x/a")
    assert bcrypt.checkpw(b"new", bytes.fromhex(ann["password"]))


def test_overwrite_keeps_the_email_unless_told(conf, tmp_path):
    add(conf, "ann", "--ident", " (a)", "--email", "ann@example.org")
    add(conf, "ann", "--overwrite", "--display-name", "Ann")
    assert users(tmp_path)["ann"]["email"] == "ann@example.org"
    assert add(conf, "ann", "--overwrite", "--keep-password", "--email", "").returncode == 0
    assert "email" not in users(tmp_path)["ann"]


def test_an_empty_value_removes_the_field_and_keep_password_reads_none(conf, tmp_path):
    add(conf, "ann", "--ident", " (a)", "--display-name", "Ann", "--avatar-url", "mxc://x/a")
    before = users(tmp_path)["ann"]["password"]
    result = add(conf, "ann", "--overwrite", "--keep-password", "--avatar-url", "", password="")
    assert result.returncode == 0, result.stderr
    assert users(tmp_path)["ann"] == {"name": "ann", "password": before, "ident": " (a)", "display_name": "Ann"}


@pytest.mark.parametrize(
    "args, message",
    [
        (["--display-name", "Zed"], "--ident is needed for a new user"),
        (["--ident", "z", "--keep-password"], "--keep-password only goes with --overwrite"),
        (["--overwrite"], "user 'zed' does not exist; adding it needs --ident"),
        (["--overwrite", "--ident", "z", "--keep-password"], "user 'zed' does not exist; adding it needs a password"),
        (["--ident", ""], "--ident must not be empty"),
    ],
)
def test_incomplete_new_users_are_one_line_errors(conf, tmp_path, args, message):
    result = add(conf, "zed", *args)
    assert (result.returncode, result.stderr) == (1, f"homeserver: error: {message}\n")
    assert not (tmp_path / "users.json").exists() or "zed" not in users(tmp_path)


@pytest.mark.skipif(os.geteuid() != 0, reason="run as root to check that root keeps another owner")
def test_as_root_the_users_file_keeps_owner_group_and_mode_and_no_lock_file(conf, tmp_path):
    path = tmp_path / "users.json"
    path.write_text('{"users": []}')
    os.chown(path, 0, 65534)  # root:<service group> 0640, readable by the service only through its group
    os.chmod(path, 0o640)
    assert add(conf, "ann", "--ident", " (a)").returncode == 0
    assert add(conf, "ann", "--ident", " (b)", "--overwrite").returncode == 0
    st = os.stat(path)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 65534, 0o640)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hs.toml", "users.json"]


# -- standard input closed, file modes -----------------------------------------------------------


def run_with_stdin_closed(*args: str) -> subprocess.CompletedProcess[str]:
    """`run.py ARGS <&-`: standard input closed (not empty), as a shell does it."""
    return subprocess.run(
        ["sh", "-c", 'exec "$0" "$@" <&-', sys.executable, os.path.join(ROOT, "run.py"), *args],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )


def test_add_user_with_standard_input_closed_is_one_line(conf, tmp_path):
    result = run_with_stdin_closed("add-user", "ann", "--ident", " (a)", "--config", str(conf))
    assert (result.returncode, result.stdout, result.stderr) == (
        1, "", "homeserver: error: no password: standard input is closed\n"
    )
    assert not (tmp_path / "users.json").exists()
    # --keep-password reads nothing, so closed standard input is no obstacle.
    assert add(conf, "ann", "--ident", " (a)").returncode == 0
    done = run_with_stdin_closed("add-user", "ann", "--overwrite", "--keep-password", "--display-name", "A",
                                 "--config", str(conf))
    assert (done.returncode, done.stdout, done.stderr) == (0, "replaced @ann:localhost\n", "")


def test_hash_password_with_standard_input_closed_is_one_line(conf):
    result = run_with_stdin_closed("hash-password", "--config", str(conf))
    assert (result.returncode, result.stdout, result.stderr) == (
        1, "", "homeserver: error: no password: standard input is closed\n"
    )


def test_add_user_makes_a_private_file_and_takes_others_off_an_open_one(conf, tmp_path):
    path = tmp_path / "users.json"
    assert add(conf, "ann", "--ident", " (a)").returncode == 0
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    os.chmod(path, 0o644)  # as git checks a file out, or an editor saves it under umask 022
    result = add(conf, "bob", "--ident", " (b)")
    # No warning from the command itself: it fixes what the server would warn of.
    assert (result.returncode, result.stderr) == (0, "")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    os.chmod(path, 0o644)
    assert run("lock", "bob", "--config", str(conf)).returncode == 0
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
