"""Account state on Redis: users and sessions both on a real Redis. Locks (the hash's
`locked`, by hand and with `run.py lock`), resets, re-added names and removals take effect
at the next request, on every server sharing the stores."""

from __future__ import annotations

import concurrent.futures
import uuid
from typing import Any

import pytest

from homeserver import cli
from homeserver.sessions import token_digest
from tests.support.helpers import DEFAULT_USERS, assert_error, assert_json, hex_hash
from tests.support.openapi import validate, validate_error
from tests.support.redis_servers import redis_overrides

WHOAMI = "/_matrix/client/v3/account/whoami"
DEVICES = "/_matrix/client/v3/devices"
LOGIN = "/_matrix/client/v3/login"
LOGOUT = "/_matrix/client/v3/logout"


@pytest.fixture
def session_options() -> dict[str, Any]:
    return {}


@pytest.fixture
def config_overrides(redis_users, redis_url, session_options) -> dict[str, dict[str, Any]]:
    overrides = redis_overrides(redis_users)
    overrides["sessions"] = {"store": "redis", **session_options}
    overrides["sessions.redis"] = {"url": redis_url, "key_prefix": f"test:{uuid.uuid4().hex}:sessions:"}
    return overrides


def login_body(user: str, password: str) -> dict[str, Any]:
    return {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user}, "password": password}


async def assert_locked(fetch: Any, token: str) -> None:
    for path in (WHOAMI, DEVICES):
        resp = await fetch(path, token=token)
        assert assert_error(resp, 401, "M_USER_LOCKED")["soft_logout"] is True
        validate_error(resp)


async def assert_works(fetch: Any, token: str) -> None:
    resp = await fetch(WHOAMI, token=token)
    assert assert_json(resp)["user_id"] == "@alice:localhost"
    validate(resp, "whoami.yaml", "/account/whoami")


async def assert_ended(fetch: Any, token: str) -> None:
    resp = await fetch(WHOAMI, token=token)
    assert assert_error(resp, 401, "M_UNKNOWN_TOKEN")["soft_logout"] is False
    validate(resp, "whoami.yaml", "/account/whoami")


@pytest.fixture
def config_file(tmp_path, redis_users):
    path = tmp_path / "cli.toml"
    path.write_text(
        f'[backend]\ntype = "redis"\n\n[backend.redis]\nurl = "{redis_users.url}"\nkey_prefix = "{redis_users.prefix}"\n'
        f'email_key_prefix = "{redis_users.email_prefix}"\n'
    )
    return str(path)


def cli_run(*argv: str) -> int:
    """`run.py ARGV` in-process (on another thread: the CLI runs an event loop of its own)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(cli.main, list(argv)).result()


@pytest.mark.parametrize("value", ["true", "TRUE", "1", "yes"])
async def test_a_locked_hash_locks_and_unlocking_brings_the_tokens_back(fetch, login, redis_users, value):
    token = (await login())["access_token"]
    redis_users.put("alice", locked=value)
    await assert_locked(fetch, token)
    resp = await fetch(LOGIN, "POST", json_body=login_body("alice", "wonderland"))
    assert assert_error(resp, 401, "M_USER_LOCKED")["soft_logout"] is True
    assert_error(await fetch(LOGIN, "POST", json_body=login_body("alice", "nope")), 403, "M_FORBIDDEN")
    redis_users.client.hdel(redis_users.prefix + "alice", "locked")
    await assert_works(fetch, token)


async def test_false_values_do_not_lock_and_nonsense_is_an_operator_error(fetch, login, redis_users):
    token = (await login())["access_token"]
    for value in ("false", "0", ""):
        redis_users.put("alice", locked=value)
        await assert_works(fetch, token)
    redis_users.put("alice", locked="maybe")
    assert_error(await fetch(WHOAMI, token=token), 500, "M_UNKNOWN")


async def test_run_py_lock_and_unlock_on_redis(fetch, login, redis_users, config_file, capsys):
    token = (await login())["access_token"]
    assert cli_run("lock", "alice", "--config", config_file) == 0
    assert redis_users.get("alice")["locked"] == "true"
    assert "locked @alice:localhost" in capsys.readouterr().out
    await assert_locked(fetch, token)
    assert cli_run("unlock", "alice", "--config", config_file) == 0
    assert "locked" not in redis_users.get("alice")
    await assert_works(fetch, token)
    assert cli_run("lock", "nobody", "--config", config_file) == 1
    assert "unknown user 'nobody'" in capsys.readouterr().err
    assert not redis_users.client.exists(redis_users.prefix + "nobody")


async def test_a_reset_with_add_user_ends_sessions_on_redis(fetch, login, redis_users, config_file, monkeypatch,
                                                           hs):
    import io
    import sys

    token = (await login())["access_token"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("new-password\n"))
    assert cli_run("add-user", "alice", "--overwrite", "--rounds", "4", "--config", config_file) == 0
    await assert_ended(fetch, token)
    # Ended in the session store: the old hash back does not bring the token back.
    session = await hs.sessions.store.get("alice", token_digest(token))
    assert session is not None and session.ended_ts is not None
    redis_users.put_record(DEFAULT_USERS[0])
    await assert_ended(fetch, token)


@pytest.mark.parametrize("session_options", [{"end_on_password_change": False}])
async def test_the_option_does_not_keep_a_redis_reset_alive(fetch, login, redis_users, session_options, hs):
    """A Redis hash has no identity of its own: a new hash may be a new account (README)."""
    assert hs.credentials.end_on_password_change is False
    token = (await login())["access_token"]
    redis_users.put("alice", password=hex_hash("new-password"))
    await assert_ended(fetch, token)


async def test_removed_and_added_again_before_any_sweep(fetch, login, redis_users):
    token = (await login())["access_token"]
    redis_users.client.delete(redis_users.prefix + "alice")
    await assert_ended(fetch, token)
    redis_users.put_record({**DEFAULT_USERS[0], "password": hex_hash("another"), "ident": " [new alice]"})
    await assert_ended(fetch, token)
    assert assert_json(await fetch(LOGIN, "POST", json_body=login_body("alice", "another")))["user_id"] == (
        "@alice:localhost"
    )


async def test_a_locked_account_logs_out_on_redis(fetch, login, redis_users):
    token = (await login())["access_token"]
    redis_users.put("alice", locked="true")
    assert assert_json(await fetch(LOGOUT, "POST", token=token)) == {}
    redis_users.client.hdel(redis_users.prefix + "alice", "locked")
    await assert_ended(fetch, token)
