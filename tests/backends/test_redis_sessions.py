"""Sessions and shared login limits on Redis: faults, Cluster, two servers, clocks that disagree."""

from __future__ import annotations

import time
import uuid

import pytest

from backends.sessions import Session, create_session_store
from homeserver.config import build_config
from homeserver.ratelimit import LoginLimits
from tests.support.helpers import assert_error, assert_json
from tests.support.servers import WHOAMI, Server, call, login, write_config
from tests.test_shared_limits import LIMITS

LOGOUT = "/_matrix/client/v3/logout"
BODY = {"identifier": {"user": "alice"}, "password": "wonderland"}


def session_overrides(url: str, **options) -> dict:
    prefix = f"test:{uuid.uuid4().hex}:"
    return {"sessions": {"store": "redis"}, "sessions.redis": {"url": url, "key_prefix": prefix, **options}}


class TestPausedRedis:
    @pytest.fixture
    def config_overrides(self, redis_server):
        return session_overrides(redis_server.url, retry_after=7, socket_timeout=0.5, connect_timeout=0.5)

    async def test_readiness_asks_the_session_store_too(self, redis_server, fetch):
        """Users in the file, sessions on a Redis that is down: not ready, naming the session store."""
        assert assert_json(await fetch("/health/ready")) == {"status": "ready"}
        redis_server.stop()
        resp = await fetch("/health/ready")
        body = assert_error(resp, 503, "M_UNKNOWN")
        assert "session store" in body["error"] and resp.headers["Retry-After"] == "7"
        redis_server.start()
        assert assert_json(await fetch("/health/ready")) == {"status": "ready"}

    async def test_a_paused_store_is_503_then_recovers_and_limits_fall_back(self, redis_server, fetch, login, hs):
        token = (await login())["access_token"]
        redis_server.pause()
        try:
            for path, method in ((WHOAMI, "GET"), (LOGOUT, "POST")):
                started = time.monotonic()
                resp = await fetch(path, method, token=token)
                assert_error(resp, 503, "M_UNKNOWN")
                assert resp.headers["Retry-After"] == "7"
                assert time.monotonic() - started < 5
            assert assert_json(await fetch("/_matrix/client/versions"))
            # Logins: the shared limits fall back to this process's buckets, the session
            # cannot be recorded, so 503, never a 200 that would be lost.
            assert_error(await fetch("/_matrix/client/v3/login", "POST", json_body=BODY), 503, "M_UNKNOWN")
            assert hs.limits.fallbacks >= 1
        finally:
            redis_server.resume()
        assert assert_json(await fetch(WHOAMI, token=token))["user_id"] == "@alice:localhost"
        assert assert_json(await fetch(LOGOUT, "POST", token=token)) == {}
        assert_error(await fetch(WHOAMI, token=token), 401, "M_UNKNOWN_TOKEN")


class TestCluster:
    @pytest.fixture
    def config_overrides(self, redis_cluster):
        overrides = session_overrides(f"redis://{redis_cluster.addresses[0]}/0")
        overrides["sessions.redis"].update(mode="cluster", cluster_nodes=redis_cluster.addresses)
        return overrides

    async def test_sessions_devices_and_limits_on_a_cluster(self, fetch, login, hs):
        tokens = [(await login(device_id=d))["access_token"] for d in ("A", "B", "B")]
        bob = (await login("bob", "builder"))["access_token"]
        devices = assert_json(await fetch("/_matrix/client/v3/devices", token=tokens[0]))["devices"]
        assert sorted(d["device_id"] for d in devices) == ["A", "B"]
        assert assert_json(await fetch(LOGOUT, "POST", token=tokens[1])) == {}
        assert_error(await fetch(WHOAMI, token=tokens[1]), 401, "M_UNKNOWN_TOKEN")
        assert assert_json(await fetch(WHOAMI, token=tokens[2]))
        assert assert_json(await fetch("/_matrix/client/v3/logout/all", "POST", token=tokens[2])) == {}
        for token in tokens:
            assert_error(await fetch(WHOAMI, token=token), 401, "M_UNKNOWN_TOKEN")
        assert assert_json(await fetch(WHOAMI, token=bob))
        assert await hs.limits.shared.rate_limit("address:x", 1.0, 1.0) == 0.0
        assert await hs.limits.shared.rate_limit("address:x", 1.0, 1.0) > 0


async def test_servers_whose_clocks_disagree_share_one_bucket(redis_url, monkeypatch, tmp_path):
    """The bucket's clock is Redis `TIME`: a server ten minutes ahead agrees with one on time."""
    options = dict(build_config(session_overrides(redis_url)).section("sessions.redis"))
    stores = [create_session_store("redis", options, config_dir=str(tmp_path)) for _ in range(2)]
    for store in stores:
        await store.start()
    try:
        section = build_config({"rate_limit": {"address_burst": 2}}).section("rate_limit")
        on_time = LoginLimits.from_config(section, shared=stores[0].buckets())
        real_time = time.time
        monkeypatch.setattr(time, "time", lambda: real_time() + 600)
        ahead = LoginLimits.from_config(section, shared=stores[1].buckets())
        await on_time.check_address("10.0.0.1")
        await ahead.check_address("10.0.0.1")
        with pytest.raises(Exception) as info:
            await on_time.check_address("10.0.0.1")
        assert info.value.status == 429 and info.value.extra["retry_after_ms"] <= 6000
        assert on_time.fallbacks == ahead.fallbacks == 0
    finally:
        for store in stores:
            await store.close()


async def test_keys_expire_with_the_token_and_only_digests_are_stored(redis_url, tmp_path):
    options = dict(build_config(session_overrides(redis_url)).section("sessions.redis"))
    store = create_session_store("redis", options, config_dir=str(tmp_path))
    await store.start()
    try:
        now = int(time.time() * 1000)
        token_text = "eyJhbGciOiJIUzI1NiJ9.payload.signature"
        await store.open(Session("digest1", "alice", "PHONE", now, "10.0.0.1", now, expires_ts=now + 60_000), "P")
        client = store.connection.connect()
        keys = [k async for k in client.scan_iter(match=options["key_prefix"] + "*")]
        assert keys
        for key in keys:
            assert token_text.encode() not in key
            kind = await client.type(key)
            if kind == b"hash":
                assert all(token_text.encode() not in v for v in (await client.hgetall(key)).values())
            if b":s:" in key or b":d:" in key or key.endswith(b":devices"):
                ttl = await client.pttl(key)
                assert 0 < ttl <= 60_000, (key, ttl)
    finally:
        await store.close()


@pytest.fixture
def two_servers(redis_url, tmp_path):
    """Two `run.py` servers (own folders, own configs) on one Redis session store."""
    prefix = f"test:{uuid.uuid4().hex}:"
    servers = []
    try:
        for name in ("one", "two"):
            folder = tmp_path / name
            folder.mkdir()
            sessions = f'[sessions]\nstore = "redis"\n[sessions.redis]\nurl = "{redis_url}"\nkey_prefix = "{prefix}"\n'
            servers.append(Server("--config", write_config(folder, sessions + LIMITS)))
        yield servers
    finally:
        for server in servers:
            server.stop()


def test_two_servers_on_one_redis_see_one_logout_and_share_one_burst(two_servers):
    one, two = two_servers
    status, body = login(one.port, "alice", "wonderland")
    assert status == 200, body
    token = body["access_token"]
    assert call(two.port, WHOAMI, token=token)[0] == 200
    assert call(two.port, LOGOUT, {}, token=token) == (200, {})
    for server in (one, two):
        status, body = call(server.port, WHOAMI, token=token)
        assert (status, body["errcode"], body["soft_logout"]) == (401, "M_UNKNOWN_TOKEN", False)
    # One login already counted; two more across both servers fill the burst of 3.
    statuses = [login(server.port, "bob", "wrong")[0] for server in (two, one, two, one)]
    assert statuses == [403, 403, 429, 429], statuses
