"""The command line, run as a user would: python run.py ..."""

import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import bcrypt
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(*args, stdin="", cwd=ROOT, env=None, timeout=60):
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "run.py"), *args],
        input=stdin, capture_output=True, text=True, cwd=cwd, timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def test_hash_password_prints_hex_of_a_bcrypt_hash(conf):
    result = run("hash-password", "--config", str(conf), stdin="s3cret\n")
    assert result.returncode == 0, result.stderr
    hashed = bytes.fromhex(result.stdout.strip())
    assert hashed.startswith(b"$2b$04$") and bcrypt.checkpw(b"s3cret", hashed)
    result = run("hash-password", "--rounds", "5", stdin="pw\n")
    assert bytes.fromhex(result.stdout.strip()).startswith(b"$2b$05$")


def test_hash_password_refuses_an_empty_password():
    result = run("hash-password", stdin="\n")
    assert result.returncode == 1 and result.stderr == "homeserver: error: the password is empty\n"


def test_add_user_writes_the_file_backend_and_refuses_duplicates(conf, tmp_path):
    users = tmp_path / "users.json"
    result = run("add-user", "ann", "--ident", " #1", "--display-name", "Ann", "--avatar-url", "mxc://x/a",
                 "--config", str(conf), stdin="pw-ann\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "added @ann:localhost\n"
    (record,) = json.loads(users.read_text())["users"]
    assert {k: v for k, v in record.items() if k != "password"} == {
        "name": "ann", "ident": " #1", "display_name": "Ann", "avatar_url": "mxc://x/a"
    }
    assert bcrypt.checkpw(b"pw-ann", bytes.fromhex(record["password"]))

    again = run("add-user", "ann", "--ident", "x", "--config", str(conf), stdin="other\n")
    assert again.returncode == 1
    assert again.stderr == "homeserver: error: user 'ann' exists already (use --overwrite to replace it)\n"
    assert json.loads(users.read_text())["users"] == [record]

    replaced = run("add-user", "ann", "--ident", "y", "--overwrite", "--config", str(conf), stdin="new\n")
    assert replaced.returncode == 0
    assert json.loads(users.read_text())["users"][0]["ident"] == "y"


@pytest.mark.parametrize("name", ["Ann", "a b", "", "ann:x", "ä"])
def test_add_user_refuses_names_that_are_not_matrix_localparts(conf, name):
    result = run("add-user", name, "--ident", "x", "--config", str(conf), stdin="pw\n")
    assert result.returncode == 1 and result.stderr.startswith("homeserver: error: invalid name")


@pytest.mark.parametrize(
    "toml, env, expected",
    [
        ("[server\n", {}, "malformed TOML"),
        ('[backend]\ntype = "mongo"\n', {}, "backend.type: unknown backend 'mongo'"),
        ('[backend.file]\npath = "missing.json"\n', {}, "backend.file.path: users file"),
        ('[auth]\njwt_secret = "short"\n', {}, "auth.jwt_secret: must be at least 32 bytes"),
        ("", {"HOMESERVER_SERVER__PORT": "x"}, "server.port: expected an integer"),
    ],
)
def test_bad_config_is_one_line_not_a_traceback(tmp_path, toml, env, expected):
    path = tmp_path / "hs.toml"
    path.write_text(toml)
    # Port 0: the error under test, whatever else listens on the default port here.
    result = run("--config", str(path), "--port", "0", env=env)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("homeserver: error: ") and expected in lines[0], result.stderr


def test_malformed_users_file_names_the_record(tmp_path):
    (tmp_path / "users.json").write_text('{"users": [{"name": "ann", "password": "00"}]}')
    path = tmp_path / "hs.toml"
    path.write_text('[backend.file]\npath = "users.json"\n')
    result = run("--config", str(path), "--port", "0")
    assert result.returncode == 1
    assert "record 0 ('ann'): missing required field 'ident'" in result.stderr
    assert len(result.stderr.splitlines()) == 1


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_on_the_shipped_example_with_port_override(tmp_path):
    # The shipped conf/ serves a working demo login; the secret and the sessions go to
    # temp files, so the test leaves nothing in conf/.
    port = free_port()
    env = {**os.environ, "HOMESERVER_AUTH__SECRET_FILE": str(tmp_path / "secret"),
           "HOMESERVER_SESSIONS__SQLITE__PATH": str(tmp_path / "sessions.db")}
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "run.py", "--host", "127.0.0.1", "--port", str(port)],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 15
        while True:
            try:
                with urllib.request.urlopen(base + "/_matrix/client/versions") as resp:
                    assert json.load(resp) == {"versions": ["v1.12"]}
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
                time.sleep(0.1)
        request = urllib.request.Request(
            base + "/_matrix/client/v3/login", method="POST",
            data=json.dumps({"type": "m.login.password", "identifier": {"type": "m.id.user", "user": "alice"},
                             "password": "wonderland"}).encode(),
        )
        with urllib.request.urlopen(request) as resp:
            assert json.load(resp)["user_id"] == "@alice:localhost"
        with urllib.request.urlopen(base + "/_matrix/client/v3/profile/@alice:localhost") as resp:
            assert json.load(resp) == {"displayname": "Alice Liddell (alice)", "avatar_url": "mxc://localhost/alice"}
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0


def test_add_user_with_an_email_address_and_logging_in_with_it(conf, tmp_path):
    result = run("add-user", "eve", "--ident", "e", "--email", "Eve@Example.org", "--rounds", "4",
                 "--config", str(conf), stdin="pw-eve\n")
    assert result.returncode == 0, result.stderr
    (record,) = json.loads((tmp_path / "users.json").read_text())["users"]
    assert record["email"] == "Eve@Example.org"
    bad = run("add-user", "zed", "--ident", "z", "--email", "zed", "--config", str(conf), stdin="pw\n")
    assert bad.returncode == 1 and bad.stderr == "homeserver: error: --email 'zed' is not an e-mail address\n"


def exposed_files_config(tmp_path, processes: int, extra: str = ""):
    """A users file others may read and a signing secret its group may read; the config's path."""
    users = tmp_path / "users.json"
    users.write_text(json.dumps({"users": [{"name": "ann", "password": "00", "ident": "a"}]}))
    users.chmod(0o644)
    secret = tmp_path / "kept.secret"
    secret.write_text("k" * 40 + "\n")
    secret.chmod(0o640)
    config = tmp_path / "hs.toml"
    config.write_text(
        f'[server]\nhost = "127.0.0.1"\nport = 0\nprocesses = {processes}\n[auth]\nsecret_file = "kept.secret"\n'
        f'[backend.file]\npath = "users.json"\ncheck_passwords = false\n{extra}'
    )
    return config, users, secret


@pytest.mark.parametrize("processes", [1, 2])
def test_a_failed_start_up_is_one_line_even_with_files_others_may_read(tmp_path, processes):
    # The warnings wait until the server serves: the one line stays the only one.
    extra = '[logging]\nlevel = "WARNING"\n[sessions.sqlite]\npath = "no/such/folder/s.db"\n'
    config, _, _ = exposed_files_config(tmp_path, processes, extra)
    result = run("--config", str(config))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [result.stderr.strip()] and "sessions.sqlite.path" in result.stderr


@pytest.mark.parametrize("processes", [1, 2])
def test_serve_warns_once_of_a_users_file_and_a_secret_file_others_may_read(tmp_path, processes):
    """Each file named once however many processes read it (the workers inherit the parent's word)."""
    config, users, secret = exposed_files_config(tmp_path, processes)
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "run.py", "--config", str(config)], cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        # With workers, the parent's probe and each worker load the users: three times.
        while log.read_text().count("loaded 1 users from") < (1 if processes == 1 else 3) or (
            "listening on" not in log.read_text()
        ):
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    text = log.read_text()
    assert text.count(f"backend.file.path {users} can be accessed by others (mode 0644); chmod o-rwx it") == 1, text
    assert text.count(f"auth.secret_file {secret} can be accessed by group or others (mode 0640); chmod 600 it") == 1


# A password given on the command line of a shell stays in its history: `echo 'pw' | run.py
# hash-password`, `printf`, a here-string. The docs type it at the prompt or read a file.
PASSWORD_IN_HISTORY = re.compile(
    r"""(?:\b(?:echo|printf)\b[^|\n]*\|[^\n]*|<<<[^\n]*)run\.py[^\n]*\b(?:hash-password|add-user)\b"""
    r"""|run\.py[^\n]*\b(?:hash-password|add-user)\b[^\n]*<<<"""
)


def test_no_documented_command_puts_a_password_into_shell_history():
    found = []
    for path in [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]:
        with open(path, encoding="utf-8") as fh:
            text = fh.read().replace("\\\n", " ")  # continuation lines as one command
        found += [f"{os.path.basename(path)}: {m.group(0)}" for m in PASSWORD_IN_HISTORY.finditer(text)]
    assert found == []
    assert PASSWORD_IN_HISTORY.search("echo -n 'secret' | .venv/bin/python run.py hash-password")
    assert PASSWORD_IN_HISTORY.search("printf 'pw\\n' | python run.py add-user bob --ident b")
    assert not PASSWORD_IN_HISTORY.search("python run.py add-user bob --ident b < password.txt")


def test_ctrl_c_during_a_commands_start_up_is_exit_130_without_a_traceback():
    """Ctrl-C while run.py imports (noted by homeserver.process.early_signals, then given back
    to a command other than serve) stops the command as Ctrl-C later does: exit 130, no
    traceback. Before, the signal was sent again outside the command's handling."""
    script = (
        "import signal, sys\n"
        "from homeserver.process.early_signals import EARLY\n"
        "EARLY.install()\n"
        "signal.raise_signal(signal.SIGINT)  # Ctrl-C during the imports\n"
        "from homeserver.cli import main\n"
        "sys.exit(main(['hash-password']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, input="secret\n", capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 130 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout == ""  # the command did not run
