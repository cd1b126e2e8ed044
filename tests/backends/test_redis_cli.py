"""`run.py add-user` into Redis: in-process and as the documented command with env overrides."""

from __future__ import annotations

import concurrent.futures
import io
import os
import subprocess
import sys

import bcrypt
import pytest

from homeserver import cli
from tests.support.redis_servers import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def config_file(tmp_path, redis_users):
    path = tmp_path / "homeserver.toml"
    path.write_text(
        f'[backend]\ntype = "redis"\n\n[backend.redis]\nurl = "{redis_users.url}"\nkey_prefix = "{redis_users.prefix}"\n'
        f'email_key_prefix = "{redis_users.email_prefix}"\n'
    )
    return str(path)


@pytest.fixture
def add_user(monkeypatch, config_file):
    """add_user(name, password, *flags) -> exit status of `run.py add-user` run in-process."""

    def run(name: str, password: str, *flags: str, config: str = config_file) -> int:
        monkeypatch.setattr(sys, "stdin", io.StringIO(password + "\n"))
        argv = ["add-user", name, "--config", config, "--rounds", "4", *flags]
        # The CLI calls asyncio.run(), which unsets the main thread's event loop; the
        # loop pytest-tornasync left there would then be collected unclosed (a
        # ResourceWarning, an error here). Another thread has its own event loop.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(cli.main, argv).result()

    return run


def test_add_user_writes_the_hash(redis_users, add_user, capsys):
    assert add_user("carol", "pa55", "--ident", " (c)", "--display-name", "Carol", "--avatar-url", "mxc://x/y") == 0
    assert "added @carol:localhost" in capsys.readouterr().out
    stored = redis_users.get("carol")
    assert set(stored) == {"password", "ident", "display_name", "avatar_url"}
    assert (stored["ident"], stored["display_name"], stored["avatar_url"]) == (" (c)", "Carol", "mxc://x/y")
    assert bcrypt.checkpw(b"pa55", bytes.fromhex(stored["password"]))


def test_add_user_refuses_a_duplicate_unless_overwrite(redis_users, add_user, capsys):
    assert add_user("carol", "one", "--ident", "a", "--display-name", "Carol", "--avatar-url", "mxc://x/c") == 0
    assert add_user("carol", "two", "--ident", "b") == 1
    assert "exists already" in capsys.readouterr().err
    assert redis_users.get("carol")["ident"] == "a"
    assert add_user("carol", "two", "--ident", "b", "--overwrite") == 0
    assert capsys.readouterr().out == "replaced @carol:localhost\n"
    stored = redis_users.get("carol")
    # What was given changed; the display name and avatar, not given, stayed.
    assert (stored["ident"], stored["display_name"], stored["avatar_url"]) == ("b", "Carol", "mxc://x/c")
    assert bcrypt.checkpw(b"two", bytes.fromhex(stored["password"]))


def test_overwrite_removes_an_empty_value_and_can_keep_the_password(redis_users, add_user, capsys):
    assert add_user("carol", "one", "--ident", "a", "--display-name", "Carol", "--avatar-url", "mxc://x/c") == 0
    redis_users.client.hset(redis_users.prefix + "carol", "some_later_field", "x")  # a field add-user knows nothing of
    before = redis_users.get("carol")["password"]
    assert add_user("carol", "", "--overwrite", "--keep-password", "--display-name", "", "--avatar-url", "mxc://x/d") == 0
    assert redis_users.get("carol") == {
        "password": before, "ident": "a", "avatar_url": "mxc://x/d", "some_later_field": "x"
    }


def test_overwrite_of_a_missing_user_needs_ident_and_password(redis_users, add_user, capsys):
    assert add_user("dora", "", "--overwrite", "--keep-password", "--ident", "d") == 1
    assert capsys.readouterr().err == "homeserver: error: user 'dora' does not exist; adding it needs a password\n"
    assert add_user("dora", "pw", "--overwrite") == 1
    assert capsys.readouterr().err == "homeserver: error: user 'dora' does not exist; adding it needs --ident\n"
    assert redis_users.get("dora") == {}
    assert add_user("dora", "pw", "--overwrite", "--ident", "d") == 0
    assert capsys.readouterr().out == "added @dora:localhost\n"


def test_add_user_refuses_an_existing_user_from_the_fixtures(redis_users, add_user, capsys):
    assert add_user("alice", "x", "--ident", "i") == 1
    assert "exists already" in capsys.readouterr().err


def test_add_user_without_redis_is_a_clean_error(tmp_path, add_user, capsys):
    path = tmp_path / "down.toml"
    port = free_port()  # nothing listens there
    path.write_text(f'[backend]\ntype = "redis"\n[backend.redis]\nurl = "redis://127.0.0.1:{port}/0"\n')
    assert add_user("carol", "x", "--ident", "i", config=str(path)) == 1
    assert "user store unavailable" in capsys.readouterr().err


def test_run_py_add_user_with_env_overrides(redis_users):
    env = dict(
        os.environ,
        HOMESERVER_BACKEND__TYPE="redis",
        HOMESERVER_BACKEND__REDIS__URL=redis_users.url,
        HOMESERVER_BACKEND__REDIS__KEY_PREFIX=redis_users.prefix,
    )
    result = subprocess.run(
        [sys.executable, "run.py", "add-user", "dora", "--ident", "dora-id", "--rounds", "4"],
        cwd=ROOT, env=env, input="secret\n", capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert redis_users.get("dora")["ident"] == "dora-id"


def test_add_user_keeps_the_email_index(redis_users, add_user, capsys):
    assert add_user("carol", "pw", "--ident", "c", "--email", "Carol@Example.ORG") == 0
    assert redis_users.get("carol")["email"] == "Carol@Example.ORG"
    assert redis_users.client.smembers(redis_users.email_prefix + "carol@example.org") == {b"carol"}
    # A new address moves the name from the old set to the new one.
    assert add_user("carol", "pw", "--ident", "c", "--email", "c2@example.org", "--overwrite") == 0
    assert redis_users.client.smembers(redis_users.email_prefix + "carol@example.org") == set()
    assert redis_users.client.smembers(redis_users.email_prefix + "c2@example.org") == {b"carol"}
    assert add_user("dan", "pw", "--ident", "d", "--email", "not-an-address") == 1
    assert "is not an e-mail address" in capsys.readouterr().err


def test_overwrite_keeps_the_email_and_its_index_unless_told(redis_users, add_user, capsys):
    assert add_user("carol", "pw", "--ident", "c", "--email", "carol@example.org") == 0
    index = redis_users.email_prefix + "carol@example.org"
    assert add_user("carol", "pw2", "--overwrite", "--display-name", "Carol") == 0
    assert redis_users.get("carol")["email"] == "carol@example.org"
    assert redis_users.client.smembers(index) == {b"carol"}
    assert add_user("carol", "", "--overwrite", "--keep-password", "--email", "") == 0
    assert "email" not in redis_users.get("carol") and redis_users.client.smembers(index) == set()
