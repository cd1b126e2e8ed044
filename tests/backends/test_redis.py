"""The Redis backend through the HTTP app: live reads, bad records, names; and its config."""

from __future__ import annotations

import logging

import pytest

from backends.redis import RedisBackend
from backends.redis_connect import parse_address
from homeserver.config import build_config
from homeserver.errors import ConfigError
from tests.backends.test_redis_parity import LOGIN, PROFILE, WHOAMI, login_body
from tests.support.helpers import assert_error, assert_json, record
from tests.support.redis_servers import redis_overrides


@pytest.fixture
def config_overrides(redis_users):
    return redis_overrides(redis_users)


async def test_lower_case_fallback_only(redis_users, fetch, login):
    """Redis tries the lower-cased name, so a stored mixed-case name matches only exactly."""
    redis_users.put_record(record("Carol", "pw"))
    assert (await login("Carol", "pw"))["user_id"] == "@Carol:localhost"
    resp = await fetch(LOGIN, "POST", json_body=login_body("carol", "pw"))
    assert_error(resp, 403, "M_FORBIDDEN", "Invalid username")


async def test_users_appear_and_vanish_without_restart(redis_users, fetch, login):
    """Many processes share the store: every request reads the current hash."""
    redis_users.put_record(record("dave", "pw", "+d", display_name="Dave"))
    token = (await login("dave", "pw"))["access_token"]
    assert assert_json(await fetch(PROFILE + "@dave:localhost")) == {"displayname": "Dave+d"}
    redis_users.client.delete(redis_users.prefix + "dave")
    assert_error(await fetch(WHOAMI, token=token), 401, "M_UNKNOWN_TOKEN")
    assert_error(await fetch(PROFILE + "@dave:localhost"), 404, "M_NOT_FOUND", "Profile not found")


async def test_other_prefixes_are_invisible(redis_users, fetch):
    redis_users.client.hset("elsewhere:user:erin", mapping={"password": record("erin")["password"], "ident": "e"})
    try:
        resp = await fetch(LOGIN, "POST", json_body=login_body("erin", "secret"))
        assert_error(resp, 403, "M_FORBIDDEN", "Invalid username")
    finally:
        redis_users.client.delete("elsewhere:user:erin")


@pytest.mark.parametrize(
    ("setup", "problem"),
    [
        (lambda s: s.put("broken", password=record("x")["password"]), "missing field ident"),
        (lambda s: s.put("broken", ident="i"), "missing field password"),
        (lambda s: s.client.set(s.prefix + "broken", "a string"), "is not a hash"),
        (lambda s: s.client.hset(s.prefix + "broken", mapping={"password": "ab", "ident": b"\xff"}), "not UTF-8"),
    ],
)
async def test_malformed_record_is_a_logged_500(redis_users, fetch, caplog, setup, problem):
    setup(redis_users)
    with caplog.at_level(logging.ERROR):
        resp = await fetch(LOGIN, "POST", json_body=login_body("broken", "secret"))
        assert_error(resp, 500, "M_UNKNOWN", "Internal server error")
        assert_error(await fetch(PROFILE + "@broken:localhost"), 500, "M_UNKNOWN", "Internal server error")
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(redis_users.prefix + "broken" in m and problem in m for m in errors), errors
    # Other users are unaffected.
    assert_json(await fetch(PROFILE + "@alice:localhost"))


# -- configuration ---------------------------------------------------------------------


def redis_options(**values):
    return build_config({"backend": {"type": "redis", "redis": values}}, environ={}).section("backend.redis")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"url": "http://localhost"}, "backend.redis.url: must start with redis://"),
        ({"mode": "primary"}, "backend.redis.mode: must be one of"),
        ({"mode": "sentinel"}, "backend.redis.sentinels: list at least one sentinel"),
        ({"mode": "sentinel", "sentinels": ["h:1"], "service_name": ""}, "backend.redis.service_name"),
        ({"mode": "sentinel", "sentinels": ["h:port"]}, "backend.redis.sentinels: expected \"host:port\""),
        ({"mode": "cluster", "url": "unix:///tmp/r.sock"}, "backend.redis.url: a cluster has no unix sockets"),
        ({"cluster_nodes": ["h:70000"]}, "backend.redis.cluster_nodes"),
        ({"socket_timeout": 0}, "backend.redis.socket_timeout: must be between"),
        ({"retries": -1}, "backend.redis.retries"),
        ({"url": "redis://h/0?socket_timeout=soon"}, "backend.redis.url: Invalid value"),
    ],
)
def test_bad_config_names_the_key(values, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(")):
        RedisBackend.from_config(redis_options(**values), config_dir=".")


def test_env_overrides_url_and_prefix():
    config = build_config(
        {},
        environ={
            "HOMESERVER_BACKEND__REDIS__URL": "unix:///run/redis.sock",
            "HOMESERVER_BACKEND__REDIS__KEY_PREFIX": "p:",
        },
    )
    assert config.get("backend.redis", "url") == "unix:///run/redis.sock"
    assert config.get("backend.redis", "key_prefix") == "p:"


@pytest.mark.parametrize(
    ("text", "address"),
    [("h:1", ("h", 1)), ("h", ("h", 26379)), ("[::1]:2", ("::1", 2)), ("[::1]", ("::1", 26379))],
)
def test_parse_address(text, address):
    assert parse_address("k", text, 26379) == address


def test_from_config_does_not_connect():
    """The server may fork after loading config: the client is made in start()."""
    backend = RedisBackend.from_config(redis_options(url="redis://127.0.0.1:1/0"), config_dir=".")
    assert backend.client is None
