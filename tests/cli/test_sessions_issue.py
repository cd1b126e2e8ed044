"""`run.py sessions issue`: a token for a program, opened by the operator on a running server's store."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from homeserver.passwords import hash_password
from tests.support.redis_servers import wait_until
from tests.support.servers import ROOT, WHOAMI, Server, call, login, run_py, write_config


@pytest.fixture
def conf(tmp_path) -> str:
    """The test users on a file (read again within 5 s of a change), SQLite sessions, and INFO
    logging: the audit line is written."""
    path = write_config(tmp_path, "[rate_limit]\nenabled = false\n")
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text.replace('level = "WARNING"', 'level = "INFO"'))
    return path


@pytest.fixture
def server(conf) -> Iterator[Server]:
    running = Server("--config", conf)
    yield running
    running.stop()


def issue(conf: str, *args: str):
    return run_py("sessions", "issue", *args, "--config", conf)


def test_a_token_for_a_bot_alone_on_stdout_until_revoked(server, conf):
    done = issue(conf, "alice", "--device", "BOT")
    assert done.returncode == 0, done.stderr
    token = done.stdout.removesuffix("\n")
    assert token and "\n" not in token and " " not in token
    assert 'audit login' in done.stderr and '"BOT"' in done.stderr and "sessions issue" in done.stderr
    assert token not in done.stderr
    status, me = call(server.port, WHOAMI, token=token)
    assert (status, me["user_id"], me["device_id"]) == (200, "@alice:localhost", "BOT")
    listed = run_py("sessions", "list", "alice", "--config", conf)
    assert [line.split("\t")[:2] for line in listed.stdout.splitlines()] == [["BOT", "issued by the operator"]]
    # Issuing for the same device again replaces the first token.
    again = issue(conf, "@alice:localhost", "--device", "BOT").stdout.strip()
    assert call(server.port, WHOAMI, token=token)[0] == 401
    assert call(server.port, WHOAMI, token=again)[0] == 200
    assert run_py("sessions", "revoke", "alice", "--device", "BOT", "--config", conf).returncode == 0
    status, body = call(server.port, WHOAMI, token=again)
    assert (status, body["errcode"], body["soft_logout"]) == (401, "M_UNKNOWN_TOKEN", False)


def test_a_lifetime_ends_the_token(server, conf):
    token = issue(conf, "alice", "--device", "SHORT", "--lifetime", "2").stdout.strip()
    assert call(server.port, WHOAMI, token=token)[0] == 200
    time.sleep(3.1)
    status, body = call(server.port, WHOAMI, token=token)
    assert (status, body["errcode"]) == (401, "M_UNKNOWN_TOKEN")


def test_a_password_reset_in_the_store_ends_it(server, conf, tmp_path):
    token = issue(conf, "alice", "--device", "BOT").stdout.strip()
    assert call(server.port, WHOAMI, token=token)[0] == 200
    users = json.loads((tmp_path / "users.json").read_text())
    for user in users["users"]:
        if user["name"] == "alice":
            user["password"] = hash_password("a new password", 4)
    (tmp_path / "users.json").write_text(json.dumps(users))
    wait_until(lambda: call(server.port, WHOAMI, token=token)[0] == 401, 15, "the reset to end the bot's session")


def test_refusals_are_one_line_and_exit_1(server, conf):
    for args in (["nobody", "--device", "BOT"], ["alice", "--device", "bad device"], ["alice", "--device", "B", "--lifetime", "0"]):
        result = issue(conf, *args)
        assert result.returncode == 1, result
        assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "unknown user 'nobody'" in issue(conf, "nobody", "--device", "BOT").stderr
    missing = run_py("sessions", "issue", "alice", "--config", conf)
    assert missing.returncode == 2  # --device is required (argparse)


def test_without_the_servers_secret_nothing_is_issued_and_no_secret_made(server, conf, tmp_path):
    """A config whose signing secret no server made here (a secret file that is not there):
    one line, and neither a new secret (its token would be refused) nor a session."""
    other = tmp_path / "other.toml"
    with open(conf, encoding="utf-8") as fh:
        text = fh.read()
    other.write_text(text.replace('jwt_secret = "', 'secret_file = "missing.key"\n# jwt_secret = "'))
    done = issue(str(other), "alice", "--device", "BOT")
    assert done.returncode != 0 and done.stdout == "", done
    assert "no token signing secret" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "missing.key").exists()
    listed = run_py("sessions", "list", "--config", conf)
    assert "BOT" not in listed.stdout


def test_an_unknown_user_names_the_store_and_the_config_it_looked_in(server, conf, tmp_path):
    done = issue(conf, "mybot", "--device", "BOT")
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"unknown user 'mybot' in the file user store {tmp_path / 'users.json'} (config {conf})" in done.stderr
    assert f"run.py add-user mybot --ident ID --no-password --config {conf}" in done.stderr
    assert "or name the server's config" not in done.stderr  # it was named


def test_without_config_the_answer_says_which_config_it_read(server, conf):
    """`sessions issue mybot` without --config reads conf/homeserver.toml: the answer says so,
    and that --config names the server's own (here the default is pointed at a test config).

    In a process of its own: the command's asyncio.run() in the test's process would unset
    the loop the test runner keeps, left unclosed for a later test to trip on."""
    code = (
        "import sys; import homeserver.config as config; config.DEFAULT_CONFIG = sys.argv[1]; "
        "from homeserver.cli import main; sys.exit(main(sys.argv[2:]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, conf, "sessions", "issue", "mybot", "--device", "BOT"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 1, done.stderr
    err = done.stderr
    assert "unknown user 'mybot' in the file user store" in err and f"(config {conf})" in err, err
    assert err.rstrip().endswith("or name the server's config with --config"), err


def test_a_bot_account_with_no_password_gets_tokens_and_no_password_logs_in(server, conf, tmp_path):
    """The walk-through's bot: `add-user --no-password` reads nothing and stores no usable
    password; `sessions issue` then gives it a token."""
    added = run_py("add-user", "mybot", "--ident", " [bot]", "--no-password", "--config", conf)  # stdin empty
    assert (added.returncode, added.stdout, added.stderr) == (0, "added @mybot:localhost\n", "")
    stored = {u["name"]: u for u in json.loads((tmp_path / "users.json").read_text())["users"]}["mybot"]
    assert bytes.fromhex(stored["password"]).startswith(b"$2b$")  # a bcrypt hash, as every store keeps
    profile = "/_matrix/client/v3/profile/@mybot:localhost"
    wait_until(lambda: call(server.port, profile)[0] == 200, 15, "the server to see the new user")
    for password in ("", "mybot", " [bot]", stored["password"], "pw"):
        status, body = login(server.port, "mybot", password)
        assert (status, body.get("errcode")) == (403, "M_FORBIDDEN"), (password, body)
    token = issue(conf, "mybot", "--device", "BOT").stdout.strip()
    status, me = call(server.port, WHOAMI, token=token)
    assert (status, me["user_id"], me["device_id"]) == (200, "@mybot:localhost", "BOT")


def test_no_password_and_keep_password_are_refused_together(conf):
    done = run_py("add-user", "alice", "--overwrite", "--keep-password", "--no-password", "--config", conf)
    assert (done.returncode, done.stderr) == (1, "homeserver: error: --no-password and --keep-password do not go together\n")
