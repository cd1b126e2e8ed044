"""A session store that cannot answer: 503 M_UNKNOWN + Retry-After, never a 401, and recovery."""

from __future__ import annotations

import sqlite3
import time

import pytest

from tests.support.helpers import assert_error, assert_json

WHOAMI = "/_matrix/client/v3/account/whoami"
LOGIN = "/_matrix/client/v3/login"
BODY = {"identifier": {"user": "alice"}, "password": "wonderland"}


@pytest.fixture
def config_overrides():
    return {"sessions.sqlite": {"timeout": 0.3}}


async def test_a_locked_store_is_503_then_recovers(fetch, login, tmp_path, session_store):
    token = (await login())["access_token"]
    conn = sqlite3.connect(tmp_path / "sessions.db", isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        resp = await fetch(LOGIN, "POST", json_body=BODY)
        body = assert_error(resp, 503, "M_UNKNOWN")
        assert "session store" in body["error"]
        assert int(resp.headers["Retry-After"]) > 0
        assert time.monotonic() - started < 3
        # Logout needs a write too: 503, and the token is not thrown away.
        assert_error(await fetch("/_matrix/client/v3/logout", "POST", token=token), 503, "M_UNKNOWN")
        # Reads never wait for a writer (WAL): the token still works, other endpoints answer.
        assert assert_json(await fetch(WHOAMI, token=token))["user_id"] == "@alice:localhost"
        assert assert_json(await fetch("/_matrix/client/versions"))
    finally:
        conn.execute("ROLLBACK")
        conn.close()
    assert assert_json(await fetch(LOGIN, "POST", json_body=BODY))["user_id"] == "@alice:localhost"
    assert assert_json(await fetch("/_matrix/client/v3/logout", "POST", token=token)) == {}


async def test_an_unreadable_store_is_503_not_401(fetch, login, session_store):
    token = (await login())["access_token"]
    read_conn = session_store.db.read_conn
    session_store.db.read_conn = sqlite3.connect(":memory:")  # no sessions table: every read fails
    try:
        resp = await fetch(WHOAMI, token=token)
        assert_error(resp, 503, "M_UNKNOWN")
        assert resp.headers["Retry-After"]
    finally:
        session_store.db.read_conn.close()
        session_store.db.read_conn = read_conn
    assert assert_json(await fetch(WHOAMI, token=token))
