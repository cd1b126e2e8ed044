"""`run.py mfa list NAME` and `mfa reset NAME` (the interface contract): one line per second
factor; a reset removes them all, audited, exit 0; an unknown user is one line and exit 1. On
the store a server of that config made, without its key."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json

import pytest

from backends.sessions.sqlite import SqliteSessionStore
from homeserver.config import load_config
from homeserver.mfa.service import SecondFactors
from tests.support.helpers import DEFAULT_USERS, JWT_SECRET
from tests.support.second_factors import add_app
from tests.support.servers import run_py

KEY = "an operator's key of at least 32 bytes, for tests"


@pytest.fixture
def config(tmp_path) -> str:
    (tmp_path / "users.json").write_text(json.dumps({"users": DEFAULT_USERS}))
    path = tmp_path / "homeserver.toml"
    path.write_text(
        f'[auth]\njwt_secret = "{JWT_SECRET}"\n[backend.file]\npath = "users.json"\n'
        f'[mfa]\nenabled = true\nkey = "{KEY}"\n[logging]\nformat = "json"\n'
    )
    return str(path)


def with_factors(config: str, work) -> None:
    """What a running server would have kept: the store made, `work(factors)` run on it."""

    async def go() -> None:
        loaded = load_config(config)
        store = SqliteSessionStore(loaded.resolve_path(loaded.get("sessions.sqlite", "path")))
        await store.start()
        try:
            await work(SecondFactors.from_config(loaded, store.factors(), None))
        finally:
            await store.close()

    # Its own event loop in another thread: asyncio.run() here would unset the main thread's
    # loop a tornasync test left there, collected unclosed later (tests/backends/test_redis_cli.py).
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, go()).result()


def test_list_prints_one_line_per_factor_and_reset_removes_them_all(config):
    async def work(factors: SecondFactors) -> None:
        await add_app(factors, "alice")
        await add_app(factors, "alice")

    with_factors(config, work)
    listed = run_py("mfa", "list", "@alice:localhost", "--config", config)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert [line.split("\t")[1:3] for line in lines] == [
        ["app", "Authenticator app"], ["recovery", "10 codes left"], ["app", "Authenticator app"]]
    assert all(len(line.split("\t")) == 5 and line.split("\t")[4] == "never" for line in lines), lines
    assert KEY not in listed.stdout
    reset = run_py("mfa", "reset", "alice", "--config", config)
    assert reset.returncode == 0, reset.stderr
    assert reset.stdout.strip() == "Removed 3 second factors of @alice:localhost (recovery codes included)."
    audit = [json.loads(line) for line in reset.stderr.splitlines() if line.startswith("{")]
    assert any(a.get("event") == "factors_reset" and a.get("user") == "alice" and a.get("count") == 3
               for a in audit), reset.stderr
    again = run_py("mfa", "list", "alice", "--config", config)
    assert again.returncode == 0 and again.stdout == ""
    assert run_py("mfa", "reset", "alice", "--config", config).stdout.startswith("@alice:localhost had no")


def test_an_unknown_user_is_one_line_and_exit_1(config):
    with_factors(config, lambda factors: asyncio.sleep(0))
    for action in ("list", "reset"):
        result = run_py("mfa", action, "nobody", "--config", config)
        assert result.returncode == 1 and result.stdout == ""
        assert result.stderr.splitlines() == ["homeserver: error: unknown user 'nobody'"], result.stderr
