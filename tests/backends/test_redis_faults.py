"""Redis faults against a private redis-server: 503 + Retry-After fast, the rest keeps serving, recovery."""

from __future__ import annotations

import asyncio
import time

import pytest

from backends.redis import RedisBackend
from homeserver.errors import StoreUnavailable
from tests.backends.test_redis_parity import (
    CAPABILITIES,
    LOGIN,
    PROFILE,
    WHOAMI,
    login_body,
)
from tests.support.helpers import assert_error, assert_json
from tests.support.redis_servers import make_store, redis_overrides

RETRY_AFTER = 7
# Generous: the defaults give up after about 2 s (two 1 s reads) on a silent server.
FAULT_BOUND = 5.0


@pytest.fixture
def private_redis_users(redis_server, user_records):
    private_redis_users = make_store(redis_server.url)
    for record in user_records:
        private_redis_users.put_record(record)
    yield private_redis_users
    private_redis_users.client.close()


@pytest.fixture
def config_overrides(private_redis_users):
    return redis_overrides(private_redis_users, retry_after=RETRY_AFTER, max_connections=3)


async def assert_unavailable(fetch, path, method="GET", **kwargs):
    started = time.monotonic()
    resp = await fetch(path, method, **kwargs)
    elapsed = time.monotonic() - started
    assert_error(resp, 503, "M_UNKNOWN")
    assert resp.headers.get("Retry-After") == str(RETRY_AFTER), resp
    assert elapsed < FAULT_BOUND, f"{path} took {elapsed:.1f}s to answer 503"


async def assert_serving(fetch, login, token):
    assert (await login())["user_id"] == "@alice:localhost"
    assert_json(await fetch(CAPABILITIES, token=token))
    assert_json(await fetch(WHOAMI, token=token))
    assert_json(await fetch(PROFILE + "@bob:localhost"))


async def assert_store_free_endpoints_answer(fetch):
    assert_json(await fetch("/_matrix/client/versions"))
    assert_json(await fetch(LOGIN))
    assert_json(await fetch("/.well-known/matrix/client"))


async def test_paused_redis_gives_503_then_recovers(redis_server, fetch, login):
    token = (await login())["access_token"]
    redis_server.pause()
    try:
        await assert_unavailable(fetch, LOGIN, "POST", json_body=login_body("alice", "wonderland"))
        await assert_unavailable(fetch, PROFILE + "@alice:localhost")
        # Tokens are checked against the store (a deleted user's token must fail), so
        # authenticated endpoints answer 503 too rather than trust a token blindly.
        await assert_unavailable(fetch, CAPABILITIES, token=token)
        await assert_unavailable(fetch, WHOAMI, token=token)
        await assert_store_free_endpoints_answer(fetch)
    finally:
        redis_server.resume()
    await assert_serving(fetch, login, token)


async def test_stopped_redis_gives_503_then_recovers_after_restart(redis_server, private_redis_users, user_records, fetch, login):
    token = (await login())["access_token"]
    redis_server.stop()
    await assert_unavailable(fetch, LOGIN, "POST", json_body=login_body("alice", "wonderland"))
    await assert_unavailable(fetch, CAPABILITIES, token=token)
    await assert_store_free_endpoints_answer(fetch)
    redis_server.start()  # same port, empty: the test server keeps no data
    for record in user_records:
        private_redis_users.put_record(record)
    await assert_serving(fetch, login, token)


async def test_many_requests_on_a_paused_redis_all_end_fast(redis_server, fetch):
    """More waiting requests than pooled connections: each still ends in 503 within the bound."""
    redis_server.pause()
    try:
        started = time.monotonic()
        # 10: the test HTTP client's own limit, so no request waits on the client side.
        responses = await asyncio.gather(*(fetch(PROFILE + f"@user{i}:localhost") for i in range(10)))
        elapsed = time.monotonic() - started
    finally:
        redis_server.resume()
    for resp in responses:
        assert_error(resp, 503, "M_UNKNOWN")
    assert elapsed < FAULT_BOUND, f"10 requests took {elapsed:.1f}s"


async def test_start_while_redis_is_down(redis_server, config, caplog, io_loop):
    """The server starts without Redis, answers 503, and works once Redis is there."""
    # io_loop: without it pytest-tornasync runs the test on a loop nobody closes.
    redis_server.stop()
    backend = RedisBackend.from_config(config.section("backend.redis"), config_dir=".")
    await backend.start()
    try:
        assert "not reachable yet" in caplog.text
        with pytest.raises(StoreUnavailable) as info:
            await backend.check_health()
        assert info.value.retry_after == RETRY_AFTER
        with pytest.raises(StoreUnavailable):
            await backend.get_user("alice")
        redis_server.start()
        await backend.check_health()
        assert await backend.get_user("nobody") is None
    finally:
        await backend.close()
