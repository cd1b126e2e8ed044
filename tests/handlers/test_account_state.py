"""Account state on the users file: locked, reset, replaced and removed accounts take effect at
the next request (issue 19). The file is edited and reloaded as SIGHUP does (backend.reload)."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from backends.file import write_atomically
from homeserver.request_id import RequestIdFilter
from homeserver.sessions import token_digest
from tests.support.helpers import DEFAULT_USERS, assert_error, assert_json, hex_hash
from tests.support.openapi import validate, validate_error

WHOAMI = "/_matrix/client/v3/account/whoami"
CAPS = "/_matrix/client/v3/capabilities"
DEVICES = "/_matrix/client/v3/devices"
LOGOUT = "/_matrix/client/v3/logout"
LOGOUT_ALL = "/_matrix/client/v3/logout/all"
LOGIN = "/_matrix/client/v3/login"


def login_body(user: str, password: str) -> dict[str, Any]:
    return {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user}, "password": password}


async def edit_users(backend: Any, users_path: str, records: list[dict[str, Any]]) -> None:
    """Write the users file, then reload it as SIGHUP does."""
    write_atomically(users_path, json.dumps({"users": records}).encode())
    assert await backend.reload() is True


def with_alice(**changes: Any) -> list[dict[str, Any]]:
    alice, bob = (dict(r) for r in DEFAULT_USERS)
    alice.update(changes)
    return [{k: v for k, v in alice.items() if v is not None}, bob]


async def assert_locked(fetch: Any, token: str) -> None:
    for path in (WHOAMI, CAPS, DEVICES):
        resp = await fetch(path, token=token)
        body = assert_error(resp, 401, "M_USER_LOCKED")
        assert body["soft_logout"] is True
        validate_error(resp)
    validate(await fetch(WHOAMI, token=token), "whoami.yaml", "/account/whoami")


async def assert_works(fetch: Any, token: str) -> None:
    resp = await fetch(WHOAMI, token=token)
    assert assert_json(resp) == {"user_id": "@alice:localhost", "device_id": "DUMMY"}
    validate(resp, "whoami.yaml", "/account/whoami")


async def assert_ended(fetch: Any, token: str) -> None:
    resp = await fetch(WHOAMI, token=token)
    body = assert_error(resp, 401, "M_UNKNOWN_TOKEN")
    assert body["soft_logout"] is False
    validate(resp, "whoami.yaml", "/account/whoami")


# -- locked ---------------------------------------------------------------------------------


async def test_lock_and_unlock_keep_the_same_tokens(fetch, login, backend, users_path, session_store):
    first, second = (await login())["access_token"], (await login())["access_token"]
    await edit_users(backend, users_path, with_alice(locked=True))
    await assert_locked(fetch, first)
    await assert_locked(fetch, second)
    # The sessions stay while locked.
    assert (await session_store.get("alice", token_digest(first))).ended_ts is None
    await edit_users(backend, users_path, with_alice(locked=False))
    await assert_works(fetch, first)
    await assert_works(fetch, second)


async def test_a_locked_account_may_log_out(fetch, login, backend, users_path):
    first, second, third = [(await login())["access_token"] for _ in range(3)]
    await edit_users(backend, users_path, with_alice(locked=True))
    resp = await fetch(LOGOUT, "POST", token=first)
    assert assert_json(resp) == {}
    validate(resp, "logout.yaml", "/logout", "POST")
    await edit_users(backend, users_path, with_alice())  # unlocked: the logged-out token stays out
    await assert_ended(fetch, first)
    await assert_works(fetch, second)
    await edit_users(backend, users_path, with_alice(locked=True))
    assert assert_json(await fetch(LOGOUT_ALL, "POST", token=second)) == {}
    await edit_users(backend, users_path, with_alice())
    await assert_ended(fetch, second)
    await assert_ended(fetch, third)


async def test_locked_login_answers_after_rules_3_and_5(fetch, backend, users_path, session_store):
    await edit_users(backend, users_path, with_alice(locked=True))
    resp = await fetch(LOGIN, "POST", json_body=login_body("alice", "wonderland"))
    body = assert_error(resp, 401, "M_USER_LOCKED")
    assert body["soft_logout"] is True
    validate_error(resp)
    assert await session_store.devices("alice") == []  # no session was opened
    # Rule 5 (a wrong password) and rule 3 (an unknown name) answer first, as for anyone.
    assert_error(await fetch(LOGIN, "POST", json_body=login_body("alice", "nope")), 403, "M_FORBIDDEN",
                 "Invalid username or password")
    assert_error(await fetch(LOGIN, "POST", json_body=login_body("nobody", "x")), 403, "M_FORBIDDEN",
                 "Invalid username")
    await edit_users(backend, users_path, with_alice())
    assert_json(await fetch(LOGIN, "POST", json_body=login_body("alice", "wonderland")))


@pytest.mark.parametrize("user_records", [[{**DEFAULT_USERS[0], "locked": "yes"}]])
def test_locked_must_be_a_boolean(make_config, io_loop, users_path):
    from backends.file import FileBackend
    from homeserver.errors import ConfigError

    with pytest.raises(ConfigError, match="'locked' must be true or false"):
        io_loop.run_sync(FileBackend(users_path).start)


# -- credentials changed, account replaced, removed -----------------------------------------


async def test_a_password_reset_ends_earlier_sessions(fetch, login, backend, users_path, session_store):
    old = (await login())["access_token"]
    await edit_users(backend, users_path, with_alice(password=hex_hash("new-password")))
    await assert_ended(fetch, old)
    # Ended in the store: putting the old hash back does not bring the token back.
    assert (await session_store.get("alice", token_digest(old))).ended_ts is not None
    await edit_users(backend, users_path, with_alice())
    await assert_ended(fetch, old)
    # A session opened with the new password is not touched by the old one's end.
    await edit_users(backend, users_path, with_alice(password=hex_hash("new-password")))
    new = (await login(password="new-password"))["access_token"]
    await assert_works(fetch, new)


async def test_a_reset_ends_unused_sessions_too_at_the_first_request(fetch, login, backend, users_path,
                                                                     session_store):
    phone = (await login(device_id="PHONE"))["access_token"]
    laptop = (await login(device_id="LAPTOP"))["access_token"]
    await edit_users(backend, users_path, with_alice(password=hex_hash("new-password")))
    await assert_ended(fetch, phone)  # one request finds it: every stale session of alice ends
    assert (await session_store.get("alice", token_digest(laptop))).ended_ts is not None
    assert await session_store.devices("alice") == []


async def test_the_sweep_ends_stale_sessions_nobody_uses(login, hs, backend, users_path, session_store):
    """As for a store that does not say what changed (Redis, LDAP): the sweep finds them."""
    await hs.stop()  # nothing follows what the store says changed
    token = (await login())["access_token"]
    await edit_users(backend, users_path, with_alice(ident=" [alice, again]"))
    assert await hs.devices.sweep_removed_users(hs.users) == 1
    assert (await session_store.get("alice", token_digest(token))).ended_ts is not None


@pytest.mark.parametrize("config_overrides", [{"sessions": {"end_on_password_change": False}}])
async def test_without_end_on_password_change_a_file_reset_still_ends_sessions(fetch, login, backend,
                                                                               users_path, hs):
    """A users-file record has no identity of its own: a new hash may be a new account under
    the old name, so it ends the sessions even with the option off (README)."""
    assert hs.credentials.end_on_password_change is False
    token = (await login())["access_token"]
    await edit_users(backend, users_path, with_alice(password=hex_hash("new-password")))
    await assert_ended(fetch, token)


@pytest.mark.parametrize("change", ["password", "ident", "both"])
async def test_a_name_removed_and_added_again_never_revives_a_token(fetch, login, backend, users_path, change):
    token = (await login())["access_token"]
    await edit_users(backend, users_path, [DEFAULT_USERS[1]])  # alice removed
    await assert_ended(fetch, token)
    new = {"password": hex_hash("another"), "ident": " [someone else]"}
    if change != "both":
        new = {change: new[change]}
    await edit_users(backend, users_path, with_alice(**new))  # before any sweep
    await assert_ended(fetch, token)


async def test_a_changed_display_name_ends_nothing(fetch, login, backend, users_path):
    token = (await login())["access_token"]
    await edit_users(backend, users_path, with_alice(display_name="Alice L.", avatar_url=None, email="a@example.org"))
    await assert_works(fetch, token)


# -- audit ----------------------------------------------------------------------------------


def audit_lines(caplog: Any) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "homeserver.audit"]


async def test_audit_lines_name_who_what_and_no_secret(fetch, login, backend, users_path, caplog):
    caplog.set_level(logging.INFO, logger="homeserver.audit")
    caplog.handler.addFilter(RequestIdFilter())
    token = (await login(device_id="PHONE"))["access_token"]
    assert_error(await fetch(LOGIN, "POST", json_body=login_body("alice", "wrong-password")), 403, "M_FORBIDDEN")
    await edit_users(backend, users_path, with_alice(locked=True))
    await fetch(WHOAMI, token=token)
    await fetch(WHOAMI, token=token)  # a lock is audited once, not per request
    await edit_users(backend, users_path, with_alice())
    await fetch(WHOAMI, token=token)
    new_hash = hex_hash("new-password")
    await edit_users(backend, users_path, with_alice(password=new_hash))
    await fetch(WHOAMI, token=token)
    other = (await login(password="new-password"))["access_token"]
    await fetch(LOGOUT, "POST", token=other)

    records = audit_lines(caplog)
    events = [(r.audit["event"], r.audit.get("outcome") or r.audit.get("reason")) for r in records]
    assert events == [
        ("login", "success"),
        ("login", "bad_password"),
        ("lock", "seen by the auth step"),
        ("unlock", "seen by the auth step"),
        ("sessions_ended", "password_changed"),
        ("login", "success"),
        ("logout", "logout"),
    ]
    first = records[0].audit
    assert (first["user"], first["device"], first["client"]) == ("alice", "PHONE", "127.0.0.1")
    # Each written while serving a request, but the reload's end of the reset's sessions
    # (unless the next request came first and ended them itself).
    assert {r.audit["event"] for r in records if r.request_id == "-"} <= {"sessions_ended"}
    secrets = [token, other, "wonderland", "wrong-password", "new-password", new_hash,
               DEFAULT_USERS[0]["password"], bytes.fromhex(new_hash).decode()]
    for r in records:
        text = r.getMessage() + json.dumps(r.audit)
        assert not any(secret in text for secret in secrets), text


async def test_audit_line_of_a_locked_login(fetch, backend, users_path, caplog):
    caplog.set_level(logging.INFO, logger="homeserver.audit")
    await edit_users(backend, users_path, with_alice(locked=True))
    await fetch(LOGIN, "POST", json_body=login_body("alice", "wonderland"))
    [line] = audit_lines(caplog)
    assert (line.audit["event"], line.audit["user"], line.audit["outcome"]) == ("login", "alice", "locked")


@pytest.mark.parametrize("sweeps_before_re_add", [0, 1, 2])
async def test_re_added_name_stays_dead_whatever_the_sweep_timing(fetch, login, hs, backend, users_path,
                                                                  session_store, sweeps_before_re_add):
    token = (await login())["access_token"]
    await edit_users(backend, users_path, [DEFAULT_USERS[1]])  # alice removed
    for _ in range(sweeps_before_re_add):
        await hs.devices.sweep_removed_users(hs.users)
    await edit_users(backend, users_path, with_alice(password=hex_hash("another")))
    await hs.devices.sweep_removed_users(hs.users)
    await assert_ended(fetch, token)
    assert (await session_store.get("alice", token_digest(token))).ended_ts is not None
    await hs.devices.sweep_removed_users(hs.users)
    await assert_ended(fetch, token)


async def test_a_reload_ends_the_sessions_of_a_reset_account_at_once(login, backend, users_path, session_store):
    """No request needed: the reload names the changed accounts (with delegation, Synapse
    deletes their devices at once instead of within its two-minute cache)."""
    import asyncio

    token = (await login())["access_token"]
    bob_token = (await login("bob", "builder"))["access_token"]
    await edit_users(backend, users_path, with_alice(password=hex_hash("new-password")))
    for _ in range(200):
        session = await session_store.get("alice", token_digest(token))
        if session.ended_ts is not None:
            break
        await asyncio.sleep(0.01)
    assert session.ended_ts is not None
    assert (await session_store.get("bob", token_digest(bob_token))).ended_ts is None  # bob's record is unchanged
