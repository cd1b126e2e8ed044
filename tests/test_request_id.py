"""X-Request-ID on every response, kept from trusted proxies only, and on every log line of its request."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re

import pytest

from homeserver.logs import JsonFormatter, text_formatter
from homeserver.request_id import RequestIdFilter
from tests.support.helpers import assert_error, assert_json

HEX16 = re.compile(r"[0-9a-f]{16}")


@pytest.fixture
def log_lines():
    """Everything logged, through the filter and formatter the server installs, as JSON lines."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    root.removeHandler(handler)
    root.setLevel(old_level)


@pytest.mark.parametrize(
    "path, method, status",
    [
        ("/_matrix/client/versions", "GET", 200),
        ("/nowhere", "GET", 404),
        ("/_matrix/client/versions", "POST", 405),
        ("/_matrix/client/v3/login", "OPTIONS", 204),
        ("/_matrix/client/v3/account/whoami", "GET", 401),
        ("/health", "GET", 200),
    ],
)
async def test_every_response_carries_a_fresh_id(fetch, path, method, status):
    first, second = await fetch(path, method), await fetch(path, method)
    assert first.status == status, first
    ids = [r.headers.get("X-Request-ID") for r in (first, second)]
    assert all(HEX16.fullmatch(i or "") for i in ids), ids
    assert ids[0] != ids[1]


async def test_an_untrusted_peer_cannot_choose_the_id(fetch):
    resp = await fetch("/_matrix/client/versions", headers={"X-Request-ID": "forged-by-client"})
    assert HEX16.fullmatch(resp.headers["X-Request-ID"])


class TestTrustedProxy:
    @pytest.fixture
    def config_overrides(self):
        return {"server": {"trusted_proxies": ["127.0.0.1"]}}

    async def test_a_trusted_proxys_id_is_kept(self, fetch, log_lines):
        resp = await fetch("/_matrix/client/versions", headers={"X-Request-ID": "proxy-abc-123"})
        assert resp.headers["X-Request-ID"] == "proxy-abc-123"
        access = [line for line in log_lines() if line["logger"] == "homeserver.access"]
        assert access[-1]["request_id"] == "proxy-abc-123"

    @pytest.mark.parametrize("value", ["has space", "x" * 129, "ünicode", ""])
    async def test_a_malformed_id_is_replaced(self, fetch, value):
        resp = await fetch("/_matrix/client/versions", headers={"X-Request-ID": value})
        assert HEX16.fullmatch(resp.headers["X-Request-ID"])


async def test_every_log_line_of_a_request_carries_its_id_even_when_requests_overlap(
    fetch, backend, monkeypatch, log_lines
):
    real_get = backend.get_user
    log = logging.getLogger("homeserver.test")

    async def slow_get(name, *, case_insensitive=False):
        log.info("looking up %s", name)
        await asyncio.sleep(0.05)  # the other request runs meanwhile
        log.info("found %s", name)
        return await real_get(name, case_insensitive=case_insensitive)

    monkeypatch.setattr(backend, "get_user", slow_get)
    alice, bob = await asyncio.gather(
        fetch("/_matrix/client/v3/profile/@alice:localhost"), fetch("/_matrix/client/v3/profile/@bob:localhost")
    )
    assert_json(alice) and assert_json(bob)
    lines = log_lines()
    for resp, name in ((alice, "alice"), (bob, "bob")):
        rid = resp.headers["X-Request-ID"]
        mine = [line["message"] for line in lines if line.get("request_id") == rid]
        assert f"looking up {name}" in mine and f"found {name}" in mine, lines
        assert any(m.startswith("200 GET /_matrix/client/v3/profile/@" + name) for m in mine), lines
    outside = [line for line in lines if "request_id" not in line]
    assert not [line for line in outside if line["logger"] in ("homeserver.test", "homeserver.access")]


async def test_error_lines_carry_the_id_in_text_format(fetch, backend, monkeypatch):
    async def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(backend, "get_user", broken)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(text_formatter())
    logging.getLogger().addHandler(handler)
    try:
        resp = await fetch("/_matrix/client/v3/profile/@alice:localhost")
    finally:
        logging.getLogger().removeHandler(handler)
    assert_error(resp, 500, "M_UNKNOWN")
    rid = resp.headers["X-Request-ID"]
    text = stream.getvalue()
    assert f"[{rid}]: uncaught exception in GET" in text, text
    assert f"[{rid}]: 500 GET /_matrix/client/v3/profile/@alice:localhost" in text, text


def test_forked_workers_never_share_a_sequence_of_ids():
    """IDs come from `random`, which seeds itself again in a forked child (os.register_at_fork)."""
    import os

    from homeserver.request_id import new_id

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: send its next IDs and leave at once
        os.write(write, " ".join(new_id() for _ in range(4)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as pipe:
        child = pipe.read().split()
    parent = [new_id() for _ in range(4)]
    assert len(child) == 4 and all(HEX16.fullmatch(i) for i in child + parent)
    assert not set(child) & set(parent)
