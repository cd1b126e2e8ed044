"""Issue 21 on a real Redis: sessions on the users' Redis by default, add-user --email duplicates."""

from __future__ import annotations

import uuid

import pytest

from tests.backends.test_redis_cli import add_user, config_file  # noqa: F401 (fixtures)
from tests.support.helpers import assert_json
from tests.support.redis_servers import redis_overrides

WHOAMI = "/_matrix/client/v3/account/whoami"
PREFIX = f"test:{uuid.uuid4().hex}:session:"


@pytest.fixture
def config_overrides(redis_users):
    # [sessions] store = "redis" and no [sessions.redis] url: the users' Redis (a private
    # redis-server on a free port, never 127.0.0.1:6379).
    return {**redis_overrides(redis_users), "sessions": {"store": "redis"}, "sessions.redis": {"key_prefix": PREFIX}}


async def test_sessions_without_a_url_live_on_the_users_redis(hs, login, fetch, redis_users):
    assert hs.config.get("sessions.redis", "url") == redis_users.url
    token = (await login())["access_token"]
    assert assert_json(await fetch(WHOAMI, token=token))["user_id"] == "@alice:localhost"
    keys = list(redis_users.client.scan_iter(match=PREFIX + "*"))
    assert keys, "no session keys on the users' Redis"
    for key in keys:
        redis_users.client.delete(key)


def test_add_user_refuses_an_address_another_user_holds(redis_users, add_user, capsys):  # noqa: F811
    assert add_user("ann", "pw", "--ident", "a", "--email", "Ann@Example.org") == 0
    capsys.readouterr()
    assert add_user("bea", "pw", "--ident", "b", "--email", "ANN@example.ORG") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("homeserver: error: --email") and "@ann:localhost" in err
    assert redis_users.get("bea") == {}
    assert add_user("ann", "pw", "--overwrite", "--keep-password", "--email", "ann@example.org") == 0
