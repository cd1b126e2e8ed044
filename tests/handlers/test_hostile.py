"""Hostile input: always a Matrix JSON error or a clean close, never a 500 or a stall."""

from __future__ import annotations

import json
import socket
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.helpers import assert_error, assert_json

LOGIN = "/_matrix/client/v3/login"
PROFILE = "/_matrix/client/v3/profile/"
WHOAMI = "/_matrix/client/v3/account/whoami"


@pytest.fixture
def config_overrides():
    return {"rate_limit": {"enabled": False}}


def assert_matrix_error(resp) -> None:
    """Any 4xx/5xx must be the Matrix error shape, and never a 500."""
    assert resp.status != 500, resp
    if resp.status >= 400:
        body = assert_json(resp, resp.status)
        assert isinstance(body.get("errcode"), str) and body["errcode"].startswith("M_"), resp
        assert isinstance(body.get("error"), str), resp


# -- bodies ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, status, errcode",
    [
        ("[" * 30000 + "]" * 30000, 400, "M_NOT_JSON"),
        ('{"a":' * 10000 + "1" + "}" * 10000, 400, "M_NOT_JSON"),
        ('{"identifier":' + '{"user":' * 500 + '"x"' + "}" * 501, 400, "M_INVALID_PARAM"),
        ('{"user": "alice", "password": "\\ud800"}', 403, "M_FORBIDDEN"),
        ('{"user": "alice\\u0000", "password": "x"}', 403, "M_FORBIDDEN"),
        ('{"user": "alice", "password": "wonder\\u0000land"}', 403, "M_FORBIDDEN"),
        ('{"user": "' + "a" * 60000 + '", "password": "x"}', 403, "M_FORBIDDEN"),
        ('{"user": "alice", "password": "' + "p" * 60000 + '"}', 403, "M_FORBIDDEN"),
        ('{"user": "alice", "password": "x", "device_id": "' + "d" * 600 + '"}', 400, "M_INVALID_PARAM"),
        (b'{"user": "\xff\xfe", "password": "x"}', 400, "M_NOT_JSON"),
        ('{"user": 1e999, "password": "x"}', 400, "M_INVALID_PARAM"),
        ('{"user": "alice", "password": Infinity}', 400, "M_NOT_JSON"),
        ("\ufeff{}", 400, "M_NOT_JSON"),
        ("x" * 70000, 413, "M_TOO_LARGE"),
    ],
    ids=lambda v: repr(v)[:40] if isinstance(v, (str, bytes)) else str(v),
)
async def test_hostile_login_bodies(fetch, body, status, errcode):
    assert_error(await fetch(LOGIN, "POST", body=body), status, errcode)


# -- paths -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, status",
    [
        (PROFILE + "%ff%fe", 400),
        (PROFILE + "%zz", 404),
        (PROFILE + "%", 404),
        (PROFILE + "%40al%00ice%3Alocalhost", 404),
        (PROFILE + "@" + "a" * 5000 + ":localhost", 404),
        (PROFILE + quote("@" + "ü" * 2000 + ":localhost"), 404),
        (PROFILE + "%40alice%3Alocalhost/%ff", 404),
        (PROFILE + "..%2F..%2Fetc%2Fpasswd", 404),
        ("/_matrix/client/v3/%ff", 404),
        ("/" + "a/" * 3000, 404),
    ],
)
async def test_hostile_paths(fetch, path, status):
    resp = await fetch(path)
    assert resp.status == status, resp
    assert_matrix_error(resp)


# -- tokens ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header",
    [
        "Bearer",
        "Bearer ",
        "Bearer    ",
        "Basic YWxpY2U6d29uZGVybGFuZA==",
        "Bearer a.b.c",
        "Bearer ..",
        "Bearer eyJhbGciOiJub25lIn0.eyJzdWIiOiJhbGljZSJ9.",
        "Bearer eyJhbGciOiJIUzI1NiJ9.W10.c2ln",
        "Bearer " + "A" * 20000,
        "bearer\tabc",
        "Bearer tok\u00e9n",
        "\u00ff\u00fe",
    ],
)
async def test_garbage_authorization(fetch, header):
    resp = await fetch(WHOAMI, headers={"Authorization": header})
    assert resp.status == 401, resp
    assert_matrix_error(resp)


async def test_garbage_query_token(fetch):
    resp = await fetch(WHOAMI + "?access_token=%ff%fe")
    assert_error(resp, 401, "M_UNKNOWN_TOKEN")
    resp = await fetch(WHOAMI + "?access_token=a&access_token=b")
    assert_error(resp, 401, "M_MISSING_TOKEN")


# -- raw HTTP --------------------------------------------------------------------


def raw_exchange(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send raw bytes; return everything read until the server closes or times out."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
                if b"\r\n\r\n" in b"".join(chunks) and b"Connection: close" not in b"".join(chunks):
                    break
        except (ConnectionResetError, TimeoutError):
            pass
        return b"".join(chunks)


@pytest.mark.parametrize(
    "data",
    [
        b"GET /_matrix/client/versions HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n",
        b"GET /" + b"a" * 200_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /_matrix/client/v3/profile/\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x00\x01\x02\x03garbage\r\n\r\n",
        b"GET / HTTP/9.9\r\n\r\n",
        b"POST /_matrix/client/v3/login HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
        b"POST /_matrix/client/v3/login HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n",
        b"POST /_matrix/client/v3/login HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"GET /_matrix/client/versions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\x00\r\n\r\n",
    ],
    ids=["huge-header", "huge-uri", "raw-non-utf8-path", "binary", "bad-version", "negative-length",
         "huge-length", "bad-chunk", "binary-auth"],
)
def test_raw_requests_get_an_answer_or_a_clean_close(http_server, http_server_port, io_loop, data):
    port = http_server_port[1]
    reply = io_loop.run_sync(lambda: io_loop.run_in_executor(None, raw_exchange, port, data), timeout=20)
    status_line = reply.split(b"\r\n", 1)[0]
    assert not status_line.startswith(b"HTTP/1.1 5"), reply[:300]
    if b"HTTP/1.1 2" in status_line or b"HTTP/1.1 4" in status_line:
        head, _, body = reply.partition(b"\r\n\r\n")
        if body and b"Content-Length" in head and b"Bad Request" not in status_line:
            assert b'"errcode"' in body, reply[:300]


def test_chunked_body_over_the_limit(http_server, http_server_port, io_loop):
    chunk = b"400\r\n" + b"x" * 1024 + b"\r\n"
    data = (
        b"POST /_matrix/client/v3/login HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        b"Connection: close\r\n\r\n" + chunk * 100 + b"0\r\n\r\n"
    )
    reply = io_loop.run_sync(lambda: io_loop.run_in_executor(None, raw_exchange, http_server_port[1], data), timeout=20)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:300]
    assert b'"errcode":"M_TOO_LARGE"' in reply


# -- fuzzing -----------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)
names = st.sampled_from(["alice", "ALICE", "@alice:localhost", "@alice:elsewhere", "bob", ""]) | st.text(max_size=60)
login_bodies = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["m.login.password", "m.login.token"]) | json_values,
        "identifier": st.fixed_dictionaries(
            {}, optional={"type": st.just("m.id.user") | json_values, "user": names | json_values}
        )
        | json_values,
        "user": names | json_values,
        "password": st.sampled_from(["wonderland", "builder"]) | st.text(max_size=100) | json_values,
        "device_id": st.text(max_size=20) | json_values,
        "medium": json_values,
        "address": json_values,
    },
) | json_values

FUZZ = settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FUZZ
@given(body=login_bodies)
def test_fuzz_login_body(io_loop, fetch, body):
    resp = io_loop.run_sync(lambda: fetch(LOGIN, "POST", body=json.dumps(body)))
    assert_matrix_error(resp)
    assert resp.status in (200, 400, 403), resp


@FUZZ
@given(raw=st.binary(max_size=200))
def test_fuzz_login_bytes(io_loop, fetch, raw):
    resp = io_loop.run_sync(lambda: fetch(LOGIN, "POST", body=raw))
    assert_matrix_error(resp)


@FUZZ
@given(user_id=st.text(max_size=300), quoted=st.booleans(), field=st.sampled_from(["", "/displayname", "/avatar_url", "/x"]))
def test_fuzz_profile_path(io_loop, fetch, user_id, quoted, field):
    segment = quote(user_id, safe="") if quoted else quote(user_id, safe="@:%")
    if not segment or segment in (".", ".."):
        segment = "x" + segment
    resp = io_loop.run_sync(lambda: fetch(PROFILE + segment + field))
    assert_matrix_error(resp)
    assert resp.status in (200, 400, 404), resp


@FUZZ
@given(header=st.text(st.characters(min_codepoint=32, max_codepoint=255, exclude_characters="\x7f"), max_size=300))
def test_fuzz_authorization_header(io_loop, fetch, header):
    resp = io_loop.run_sync(lambda: fetch(WHOAMI, headers={"Authorization": header.strip() or "x"}))
    assert_matrix_error(resp)
    assert resp.status == 401, resp
