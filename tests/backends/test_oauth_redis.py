"""The OAuth 2.0 API with the sessions (and so the OAuth store) on a real Redis: the flow, the
lost answer retried, a replay, revocation, and a user removed between refreshes."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.handlers.test_account_state import edit_users
from tests.oauth.conftest import OAuthClient
from tests.oauth.test_refresh import use
from tests.support.helpers import DEFAULT_USERS, assert_error, assert_json

pytestmark = pytest.mark.usefixtures("io_loop")

WHOAMI = "/_matrix/client/v3/account/whoami"


@pytest.fixture
def config_overrides(redis_url):
    prefix = f"test:{uuid.uuid4().hex}:"
    return {"oauth": {"enabled": True}, "sessions": {"store": "redis"}, "sessions.redis": {"url": redis_url, "key_prefix": prefix}}


@pytest.fixture
def client(fetch) -> OAuthClient:
    return OAuthClient(fetch)


def invalid_grant(resp) -> None:
    assert resp.status == 400 and resp.json["error"] == "invalid_grant", resp


async def test_flow_retry_replay_and_revocation_on_redis(client, fetch, session_store, hs):
    first = await client.login("REDIS00001")
    assert [d.device_id for d in await hs.devices.list_devices("alice")] == ["REDIS00001"]
    assert_json(await client.refresh(first["refresh_token"]))  # lost
    second = assert_json(await client.refresh(first["refresh_token"]))  # retried
    await use(fetch, hs, second["access_token"])
    invalid_grant(await client.refresh(first["refresh_token"]))  # a replay now: the session ends
    body = assert_error(await fetch(WHOAMI, token=second["access_token"]), 401, "M_UNKNOWN_TOKEN")
    assert body["soft_logout"] is False
    third = await client.login("REDIS00002")
    assert_json(await client.revoke(third["access_token"]))
    invalid_grant(await client.refresh(third["refresh_token"]))


async def test_a_code_is_used_once_and_a_removed_user_ends_on_redis(client, fetch, backend, users_path):
    code, _ = await client.code("REDIS00003")
    tokens = assert_json(await client.exchange(code))
    resp = await client.exchange(code)
    assert resp.status == 400 and resp.json["error"] == "invalid_grant"
    assert_error(await fetch(WHOAMI, token=tokens["access_token"]), 401, "M_UNKNOWN_TOKEN")
    tokens = await client.login("REDIS00004")
    await edit_users(backend, users_path, [DEFAULT_USERS[1]])
    invalid_grant(await client.refresh(tokens["refresh_token"]))


class TestShortLifetime:
    @pytest.fixture
    def config_overrides(self, redis_url):
        prefix = f"test:{uuid.uuid4().hex}:"
        return {"oauth": {"enabled": True, "access_token_lifetime": 1}, "sessions": {"store": "redis"},
                "sessions.redis": {"url": redis_url, "key_prefix": prefix}}

    async def test_a_replay_after_the_used_access_token_expired_ends_the_session_on_redis(self, client, fetch, hs):
        # Issue 34, finding 2: on Redis the access token's session key expires with it; the
        # grant keeps that it was used.
        first = await client.login("REDIS00005")
        second = assert_json(await client.refresh(first["refresh_token"]))
        await use(fetch, hs, second["access_token"])
        await asyncio.sleep(2.2)
        invalid_grant(await client.refresh(first["refresh_token"]))
        invalid_grant(await client.refresh(second["refresh_token"]))
        assert await hs.devices.list_devices("alice") == []

    async def test_a_lost_answer_is_retried_after_the_new_access_token_expired_unused_on_redis(self, client, fetch):
        first = await client.login("REDIS00006")
        assert_json(await client.refresh(first["refresh_token"]))  # lost
        await asyncio.sleep(2.2)
        retried = assert_json(await client.refresh(first["refresh_token"]))
        assert_json(await fetch(WHOAMI, token=retried["access_token"]))
