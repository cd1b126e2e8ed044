"""The bounded password pool: a flood of logins gets 429s, never a queue without end or a 500."""

from __future__ import annotations

import asyncio

import pytest

from homeserver.passwords import Overloaded, PasswordChecker
from tests.support.helpers import assert_error, assert_json, hex_hash, record

# Cost 10 takes tens of milliseconds, long enough for concurrent checks to overlap.
SLOW_HASH = hex_hash("slowpoke", rounds=10)


async def test_checker_refuses_past_max_pending():
    checker = PasswordChecker(workers=1, max_pending=1)
    try:
        first = asyncio.ensure_future(checker.check("slowpoke", bytes.fromhex(SLOW_HASH)))
        await asyncio.sleep(0)  # let the first check take its place
        with pytest.raises(Overloaded):
            await checker.check("slowpoke", bytes.fromhex(SLOW_HASH))
        assert await first is True
        assert checker.pending == 0
    finally:
        checker.close()


@pytest.fixture
def user_records():
    return [{**record("slow"), "password": SLOW_HASH}]


@pytest.fixture
def config_overrides():
    return {"rate_limit": {"enabled": False}, "auth": {"bcrypt_workers": 1, "max_pending_logins": 2}}


async def test_login_flood_gets_429(fetch):
    body = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": "slow"}, "password": "slowpoke"}
    responses = await asyncio.gather(*(fetch("/_matrix/client/v3/login", "POST", json_body=body) for _ in range(12)))
    statuses = sorted(r.status for r in responses)
    assert set(statuses) <= {200, 429}, responses
    assert statuses.count(200) >= 2 and statuses.count(429) >= 1, statuses
    for resp in responses:
        if resp.status == 429:
            err = assert_error(resp, 429, "M_LIMIT_EXCEEDED")
            assert err["retry_after_ms"] > 0 and resp.headers["Retry-After"]
        else:
            assert_json(resp)
