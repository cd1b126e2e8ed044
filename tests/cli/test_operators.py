"""What a new operator trips on (issue 21): config, start-up errors, add-user, sessions list, logs."""

from __future__ import annotations

import json
import logging
import os
import pty
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from homeserver.config import build_config
from homeserver.errors import ConfigError
from tests.cli.test_cli import ROOT, run
from tests.process.test_startup_errors import assert_one_line
from tests.support.redis_servers import free_port
from tests.support.servers import Server, call, login, run_py, write_config

# -- the state directory -------------------------------------------------------------------


def test_files_the_server_writes_go_to_the_state_directory(tmp_path):
    state = tmp_path / "state"
    config = build_config({}, path=str(tmp_path / "etc" / "hs.toml"), environ={"STATE_DIRECTORY": f"{state}:/other"})
    assert config.get("sessions.sqlite", "path") == str(state / "sessions.db")
    assert config.get("auth", "secret_file") == str(state / "jwt.secret")
    # What the server only reads stays beside the config file; absolute paths stay as they are.
    assert config.resolve_path(config.get("backend.file", "path")) == str(tmp_path / "etc" / "users.json")
    document = {"sessions": {"sqlite": {"path": "/srv/s.db"}}}
    config = build_config(document, path=str(tmp_path / "hs.toml"), environ={"STATE_DIRECTORY": "/x"})
    assert config.get("sessions.sqlite", "path") == "/srv/s.db"
    # Without systemd, relative paths are taken from the config file's folder, as before.
    config = build_config({}, path=str(tmp_path / "hs.toml"), environ={})
    assert config.get("sessions.sqlite", "path") == str(tmp_path / "sessions.db")


@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_session_store_in_a_missing_folder_is_one_line_naming_the_key(tmp_path, processes):
    config = write_config(tmp_path, '[sessions.sqlite]\npath = "no/such/folder/sessions.db"\n')
    proc = run_py("--config", config, "--port", "0", "--processes", processes)
    assert_one_line(proc, "sessions.sqlite.path", "does not exist")
    # The CLI says the same.
    proc = run_py("sessions", "list", "alice", "--config", config)
    assert_one_line(proc, "sessions.sqlite.path", "does not exist")


# -- [sessions] store = "redis" ------------------------------------------------------------


def test_sessions_on_redis_take_the_user_backends_redis():
    document = {
        "backend": {"type": "redis", "redis": {"url": "redis://users.example:6380/2", "mode": "standalone"}},
        "sessions": {"store": "redis"},
    }
    config = build_config(document, environ={})
    assert config.get("sessions.redis", "url") == "redis://users.example:6380/2"
    assert config.get("sessions.redis", "key_prefix") == "homeserver:session:"  # its own prefix stays
    # Its own url wins, from the file or the environment.
    config = build_config(document, environ={"HOMESERVER_SESSIONS__REDIS__URL": "redis://sessions.example/0"})
    assert config.get("sessions.redis", "url") == "redis://sessions.example/0"


def test_sessions_on_redis_without_a_url_are_refused_when_the_users_are_elsewhere(tmp_path):
    with pytest.raises(ConfigError, match=r"^sessions\.redis\.url: must be set"):
        build_config({"sessions": {"store": "redis"}}, environ={})
    config = write_config(tmp_path, '[sessions]\nstore = "redis"\n')
    assert_one_line(run_py("--config", config, "--port", "0"), "sessions.redis.url")


# -- config warnings, names and addresses --------------------------------------------------


def test_config_warnings_come_after_logging_is_set_up(tmp_path):
    config = write_config(tmp_path, "[server]\nbogus = 1\n")
    config_text = Path(config).read_text().replace('level = "WARNING"\n', 'level = "INFO"\nformat = "json"\n')
    Path(config).write_text(config_text)
    env = {**os.environ, "HOMESERVER_SERVER_PORT": "9999"}
    log = tmp_path / "log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "run.py", "--config", config, "--port", "0"], cwd=ROOT, env=env, stdout=out, stderr=out
        )
        deadline = time.monotonic() + 20
        while "listening on" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.terminate()
        assert proc.wait(20) == 0
    lines = log.read_text().splitlines()
    entries = [json.loads(line) for line in lines]  # every line is JSON, the warnings included
    warnings = [e["message"] for e in entries if e["level"] == "WARNING"]
    assert "unknown config key server.bogus (ignored)" in warnings
    assert any(
        "HOMESERVER_SERVER_PORT" in w and "two underscores" in w and "HOMESERVER_SERVER__PORT" in w for w in warnings
    ), warnings


def test_a_misspelt_environment_variable_is_warned_about(caplog):
    with caplog.at_level(logging.WARNING):
        config = build_config({}, environ={"HOMESERVER_SERVER_PORT": "9999", "HOMESERVER_AUTH__BCRYPT_ROUNDS": "5"})
    assert config.get("server", "port") == 8008 and config.get("auth", "bcrypt_rounds") == 5
    assert [r.getMessage() for r in caplog.records] == [
        "ignoring environment variable HOMESERVER_SERVER_PORT: expected HOMESERVER_<SECTION>__<KEY> "
        "(two underscores between section and key: HOMESERVER_SERVER__PORT)"
    ]


@pytest.mark.parametrize(
    "name",
    ["localhost", "example.org", "matrix.example.org:8448", "192.0.2.1", "192.0.2.1:80", "[::1]", "[2001:db8::1]:8448"],
)
def test_server_names_of_the_matrix_grammar_are_accepted(name):
    assert build_config({"server": {"server_name": name}}, environ={}).get("server", "server_name") == name


@pytest.mark.parametrize(
    "name", ["Bad Name!", "", "example.org:", "example.org:99999", "[not-ipv6]", "exa_mple.org", "a/b"]
)
def test_other_server_names_are_refused_naming_the_key(name, tmp_path):
    with pytest.raises(ConfigError, match=r"^server\.server_name: "):
        build_config({"server": {"server_name": name}}, environ={})


def test_bad_server_name_stops_start_up_in_one_line(tmp_path):
    config = write_config(tmp_path, '[server]\nserver_name = "Bad Name!"\n')
    assert_one_line(run_py("--config", config, "--port", "0"), "server.server_name", "Matrix server name")


def test_base_url_follows_host_and_port_unless_configured():
    assert build_config({}, environ={}).get("server", "base_url") == "http://localhost:8008"
    config = build_config({}, environ={}, overrides={"server": {"port": 9000}})
    assert config.get("server", "base_url") == "http://localhost:9000"
    config.follow_listener(40123)  # the port actually listened on (port 0)
    assert config.get("server", "base_url") == "http://localhost:40123"
    config = build_config({"server": {"host": "192.0.2.7", "port": 80}}, environ={})
    assert config.get("server", "base_url") == "http://192.0.2.7:80"
    config = build_config({"server": {"host": "2001:db8::7"}}, environ={})
    assert config.get("server", "base_url") == "http://[2001:db8::7]:8008"
    config = build_config({"server": {"host": "0.0.0.0"}}, environ={})  # every address: this machine's name
    assert config.get("server", "base_url") == f"http://{socket.gethostname()}:8008"
    config = build_config({"server": {"base_url": "https://matrix.example.org"}}, environ={})
    config.follow_listener(40123)
    assert config.get("server", "base_url") == "https://matrix.example.org"


def test_port_flag_moves_the_well_known_and_the_support_page(tmp_path, start):
    server = start()  # port 0: the port is picked at start-up
    status, client = server.request("/.well-known/matrix/client")
    assert status == 200 and client["m.homeserver"] == {"base_url": f"http://localhost:{server.port}"}
    status, support = server.request("/.well-known/matrix/support")
    assert support["support_page"] == f"http://localhost:{server.port}/support.html"


def test_shipped_config_follows_the_port_flag(tmp_path):
    env = {**os.environ, "HOMESERVER_AUTH__SECRET_FILE": str(tmp_path / "secret"),
           "HOMESERVER_SESSIONS__SQLITE__PATH": str(tmp_path / "sessions.db")}
    server = Server(env=env)  # run.py --port N on conf/homeserver.toml
    try:
        status, client = call(server.port, "/.well-known/matrix/client")
        assert status == 200
        assert client["m.homeserver"] == {"base_url": f"http://localhost:{server.port}"}
    finally:
        server.stop()


@pytest.mark.parametrize("processes", ["1", "2"])
def test_metrics_on_the_main_port_is_said_plainly(tmp_path, processes):
    port = free_port()
    config = write_config(tmp_path, f"[metrics]\nenabled = true\nport = {port}\n")
    proc = run_py("--config", config, "--port", str(port), "--processes", processes)
    assert_one_line(proc, "metrics.port", f"{port} is the main listener's port")
    assert "another server" not in proc.stderr


# -- add-user ------------------------------------------------------------------------------


def users_file(tmp_path):
    return json.loads((tmp_path / "users.json").read_text())


def add(conf, *args, stdin="pw\n"):
    return run("add-user", *args, "--config", str(conf), stdin=stdin)


def test_an_address_another_user_holds_is_refused(conf, tmp_path):
    assert add(conf, "ann", "--ident", "a", "--email", "Ann@Example.org").returncode == 0
    before = (tmp_path / "users.json").read_bytes()
    # Compared as logins compare them: the domain's case and the local part's case do not matter.
    for address in ("ann@example.org", "ANN@EXAMPLE.ORG", " ann@Example.ORG"):
        result = add(conf, "bea", "--ident", "b", "--email", address)
        assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith("homeserver: error: --email") and "@ann:localhost" in result.stderr
        assert (tmp_path / "users.json").read_bytes() == before
    result = add(conf, "ann", "--overwrite", "--keep-password", "--email", "ANN@example.org")  # her own: fine
    assert result.returncode == 0, result.stderr
    assert add(conf, "bea", "--ident", "b", "--email", "bea@example.org").returncode == 0


def test_name_and_ident_are_checked_before_the_password_is_read(conf, tmp_path):
    assert add(conf, "ann", "--ident", "a").returncode == 0
    # Standard input is empty: a command that read the password would complain about that.
    result = add(conf, "ann", "--ident", "a", stdin="")
    assert result.stderr == "homeserver: error: user 'ann' exists already (use --overwrite to replace it)\n"
    result = add(conf, "nobody", "--overwrite", stdin="")
    assert result.stderr == "homeserver: error: user 'nobody' does not exist; adding it needs --ident\n"
    result = add(conf, "nobody", "--overwrite", "--keep-password", "--ident", "n", stdin="")
    assert result.stderr == "homeserver: error: user 'nobody' does not exist; adding it needs a password\n"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--avatar-url", "https://x.org/a.png"], "--avatar-url 'https://x.org/a.png' is not an mxc:// URI"),
        (["--avatar-url", "mxc://localhost"], "is not an mxc:// URI"),
        (["--avatar-url", "mxc://bad host/abc"], "is not an mxc:// URI"),
        (["--display-name", "Ann\nroot"], "--display-name must not contain newlines"),
        (["--display-name", "Ann\tB"], "--display-name must not contain newlines"),
        (["--ident", " (a)\r\n"], "--ident must not contain newlines"),
        (["--email", "a@b.org\nx"], "--email must not contain newlines"),
    ],
)
def test_values_are_checked(conf, tmp_path, args, message):
    result = add(conf, "ann", *(["--ident", "a"] if "--ident" not in args else []), *args, stdin="")
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr
    assert not (tmp_path / "users.json").exists()


def test_mxc_avatar_and_removing_it_are_taken(conf, tmp_path):
    assert add(conf, "ann", "--ident", "a", "--avatar-url", "mxc://example.org:8448/Abc_12-x").returncode == 0
    assert users_file(tmp_path)["users"][0]["avatar_url"] == "mxc://example.org:8448/Abc_12-x"
    assert add(conf, "ann", "--overwrite", "--keep-password", "--avatar-url", "").returncode == 0
    assert "avatar_url" not in users_file(tmp_path)["users"][0]


@pytest.mark.parametrize("stdin", ["", None], ids=["empty", "closed"])
def test_add_user_with_no_password_on_stdin_is_one_line(conf, tmp_path, stdin):
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "run.py"), "add-user", "ann", "--ident", "a", "--config", str(conf)],
        input=stdin, stdin=subprocess.DEVNULL if stdin is None else None, capture_output=True, text=True, timeout=60,
    )
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == "homeserver: error: no password: standard input is empty or closed\n"


def _read_until(fd: int, text: bytes, timeout: float = 20.0) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while text not in seen:
        assert time.monotonic() < deadline, seen
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 1024)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
    return seen


def test_ctrl_d_at_the_password_prompt_is_one_line(conf):
    pid, fd = pty.fork()
    if pid == 0:  # the child: a terminal of its own, as an operator's shell
        os.chdir(ROOT)
        os.execv(sys.executable, [sys.executable, "run.py", "add-user", "ann", "--ident", "a", "--config", str(conf)])
    try:
        assert b"Password: " in _read_until(fd, b"Password: ")
        os.write(fd, b"\x04")  # Ctrl-D
        rest = _read_until(fd, b"\n\n-never-")
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
    assert os.WEXITSTATUS(status) == 1
    lines = [line for line in rest.decode().replace("\r", "").splitlines() if line.strip()]
    assert lines == ["homeserver: error: no password given (end of input)"], rest


# -- sessions list -------------------------------------------------------------------------


def test_sessions_list_escapes_what_clients_chose(tmp_path):
    config = write_config(tmp_path, "[rate_limit]\nenabled = false\n")
    server = Server("--config", config)
    try:
        status, _ = login(server.port, "alice", "wonderland", device_id="EVIL\tDEV",
                          initial_device_display_name="Phone\tfake\nPHONY\t-\t1.2.3.4\t2020-01-01T00:00:00Z\x1b[2J\\")
        assert status == 200
        status, _ = login(server.port, "alice", "wonderland", device_id="PLAIN")
        assert status == 200
    finally:
        server.stop()
    result = run_py("sessions", "list", "alice", "--config", config)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    assert all(len(line.split("\t")) == 4 for line in lines), lines
    evil, plain = lines
    assert evil.split("\t")[:3] == [
        "EVIL\\tDEV", "Phone\\tfake\\nPHONY\\t-\\t1.2.3.4\\t2020-01-01T00:00:00Z\\x1b[2J\\\\", "127.0.0.1"
    ]
    assert plain.split("\t")[:3] == ["PLAIN", "-", "127.0.0.1"]


# -- logs ----------------------------------------------------------------------------------


async def test_readiness_503_during_a_drain_is_one_info_line(fetch, app, caplog):
    app.settings["homeserver"].inflight.draining = True
    with caplog.at_level(logging.DEBUG):
        resp = await fetch("/health/ready")
    assert resp.status == 503 and resp.json == {"errcode": "M_UNKNOWN", "error": "The server is shutting down"}
    assert resp.headers["Retry-After"] == "5"
    lines = [r for r in caplog.records if "/health/ready" in r.getMessage()]
    assert [(r.name, r.levelno) for r in lines] == [("homeserver.access", logging.INFO)]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


# -- version -------------------------------------------------------------------------------


def test_version():
    from homeserver import __version__

    result = run("--version")
    assert (result.returncode, result.stdout, result.stderr) == (0, f"homeserver {__version__}\n", "")


# -- what the README's security section says of other servers' IDs -----------------------


async def test_a_profile_of_another_servers_id_is_the_local_users(fetch):
    local = await fetch("/_matrix/client/v3/profile/@alice:localhost")
    other = await fetch("/_matrix/client/v3/profile/@alice:otherserver.example")
    assert local.status == other.status == 200
    assert other.json == local.json


def test_sessions_commands_on_a_store_no_server_made_say_so(tmp_path):
    # As root without the unit's STATE_DIRECTORY: no sessions.db beside the config. The
    # command says so instead of making an empty store there and finding nothing.
    config = write_config(tmp_path)
    for argv in (["list", "alice"], ["revoke", "alice", "--all"]):
        proc = run_py("sessions", *argv, "--config", config)
        assert_one_line(proc, f"sessions.sqlite.path: {tmp_path}/sessions.db does not exist", "STATE_DIRECTORY")
    assert not (tmp_path / "sessions.db").exists()


# -- the README's scale-out sentence -------------------------------------------------------


def test_one_secret_without_one_session_store_is_not_enough_to_scale_out(tmp_path):
    # What the old README sentence promised ("tokens are stateless") and what is true: the
    # same secret on two servers with their own SQLite stores, and B refuses A's token.
    servers = []
    try:
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            servers.append(Server("--config", write_config(tmp_path / name)))
        a, b = servers
        status, body = login(a.port, "alice", "wonderland")
        assert status == 200
        assert call(a.port, "/_matrix/client/v3/account/whoami", token=body["access_token"])[0] == 200
        status, error = call(b.port, "/_matrix/client/v3/account/whoami", token=body["access_token"])
        assert (status, error["errcode"]) == (401, "M_UNKNOWN_TOKEN")
    finally:
        for server in servers:
            server.stop()
    readme = (Path(ROOT) / "README.md").read_text()
    assert "tokens are stateless" not in readme
    assert "one shared session store" in readme
