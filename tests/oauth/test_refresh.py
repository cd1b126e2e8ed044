"""Refresh and the ends of OAuth sessions: rotation, the lost answer retried, replays, and the
user store read at every refresh (removed, reset, locked); expiry is a soft logout."""

from __future__ import annotations

import asyncio
import logging

import pytest

from homeserver.sessions import token_digest
from tests.handlers.test_account_state import edit_users, with_alice
from tests.support.helpers import DEFAULT_USERS, assert_error, assert_json, hex_hash

pytestmark = pytest.mark.usefixtures("io_loop")

WHOAMI = "/_matrix/client/v3/account/whoami"


def invalid_grant(resp) -> None:
    assert resp.status == 400 and resp.json["error"] == "invalid_grant", resp


async def use(fetch, hs, token: str) -> None:
    """A request with the token, and its last-seen write done (it is made in the background)."""
    assert_json(await fetch(WHOAMI, token=token))
    for _ in range(100):
        if await hs.oauth.store.access_used("alice", token_digest(token)):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the token's use was never recorded")


async def assert_ended(fetch, token: str) -> None:
    body = assert_error(await fetch(WHOAMI, token=token), 401, "M_UNKNOWN_TOKEN")
    assert body["soft_logout"] is False


async def test_a_lost_answer_is_retried_with_the_previous_refresh_token(client, fetch, hs):
    first = await client.login()
    lost = assert_json(await client.refresh(first["refresh_token"]))  # the client never sees this
    retried = assert_json(await client.refresh(first["refresh_token"]))
    assert retried["refresh_token"] != lost["refresh_token"]
    await use(fetch, hs, retried["access_token"])
    await assert_ended(fetch, lost["access_token"])  # never used, replaced by the retry
    after = assert_json(await client.refresh(retried["refresh_token"]))
    assert_json(await fetch(WHOAMI, token=after["access_token"]))


async def test_a_replay_after_the_new_access_token_was_used_ends_the_session(client, fetch, hs):
    first = await client.login()
    second = assert_json(await client.refresh(first["refresh_token"]))
    await use(fetch, hs, second["access_token"])
    invalid_grant(await client.refresh(first["refresh_token"]))
    await assert_ended(fetch, second["access_token"])
    invalid_grant(await client.refresh(second["refresh_token"]))


async def test_an_older_refresh_token_replayed_ends_the_session(client, fetch):
    first = await client.login()
    second = assert_json(await client.refresh(first["refresh_token"]))
    third = assert_json(await client.refresh(second["refresh_token"]))
    invalid_grant(await client.refresh(first["refresh_token"]))
    await assert_ended(fetch, third["access_token"])
    invalid_grant(await client.refresh(third["refresh_token"]))


async def test_a_removed_user_is_invalid_grant_and_the_session_ends(client, fetch, backend, users_path, hs):
    tokens = await client.login()
    await edit_users(backend, users_path, [DEFAULT_USERS[1]])
    invalid_grant(await client.refresh(tokens["refresh_token"]))
    assert await hs.devices.list_devices("alice") == []
    await edit_users(backend, users_path, with_alice())  # the same record back: still over
    invalid_grant(await client.refresh(tokens["refresh_token"]))
    await assert_ended(fetch, tokens["access_token"])


async def test_a_reset_is_invalid_grant_and_the_session_ends(client, fetch, backend, users_path, hs):
    tokens = await client.login()
    await edit_users(backend, users_path, with_alice(password=hex_hash("new password")))
    invalid_grant(await client.refresh(tokens["refresh_token"]))
    assert await hs.devices.list_devices("alice") == []
    await assert_ended(fetch, tokens["access_token"])


async def test_a_locked_user_keeps_the_session_as_password_sessions_do(client, fetch, backend, users_path):
    tokens = await client.login()
    await edit_users(backend, users_path, with_alice(locked=True))
    fresh = assert_json(await client.refresh(tokens["refresh_token"]))
    body = assert_error(await fetch(WHOAMI, token=fresh["access_token"]), 401, "M_USER_LOCKED")
    assert body["soft_logout"] is True
    await edit_users(backend, users_path, with_alice())
    assert_json(await fetch(WHOAMI, token=fresh["access_token"]))
    assert_json(await client.refresh(fresh["refresh_token"]))


async def test_sessions_revoke_and_the_sweep_end_oauth_sessions(client, fetch, hs, backend, users_path):
    tokens = await client.login("REVOKED001")
    assert [d.device_id for d in await hs.devices.list_devices("alice")] == ["REVOKED001"]
    assert await hs.devices.revoke("alice", ["REVOKED001"]) == 2  # the access token's and the grant's
    invalid_grant(await client.refresh(tokens["refresh_token"]))
    tokens = await client.login("SWEPT00001")
    await edit_users(backend, users_path, [DEFAULT_USERS[1]])
    await hs.devices.sweep_removed_users(hs.users)
    await hs.devices.sweep_removed_users(hs.users)
    await edit_users(backend, users_path, with_alice())
    invalid_grant(await client.refresh(tokens["refresh_token"]))


class TestShortLifetime:
    @pytest.fixture
    def config_overrides(self):
        return {"oauth": {"enabled": True, "access_token_lifetime": 1}}

    async def test_an_expired_access_token_is_a_soft_logout_and_refresh_goes_on(self, client, fetch):
        tokens = await client.login()
        assert tokens["expires_in"] == 1
        await asyncio.sleep(2.2)
        body = assert_error(await fetch(WHOAMI, token=tokens["access_token"]), 401, "M_UNKNOWN_TOKEN")
        assert body["soft_logout"] is True
        fresh = assert_json(await client.refresh(tokens["refresh_token"]))
        assert_json(await fetch(WHOAMI, token=fresh["access_token"]))

    async def test_a_lost_answer_is_retried_after_the_new_access_token_expired_unused(self, client, fetch):
        # The spec's MUST: a client whose refresh answer was lost retries with the previous refresh
        # token "later" (a phone asleep for longer than an access token lives); the new access token
        # was never used, so the retry is no replay and the session stays.
        first = await client.login()
        assert_json(await client.refresh(first["refresh_token"]))  # the client never sees this answer
        await asyncio.sleep(2.2)
        retried = assert_json(await client.refresh(first["refresh_token"]))
        assert_json(await fetch(WHOAMI, token=retried["access_token"]))
        assert_json(await client.refresh(retried["refresh_token"]))

    async def test_a_replay_after_the_used_access_token_expired_ends_the_session(self, client, fetch, hs, caplog):
        # Issue 34, finding 2 (RFC 9700 4.14.2): the retry is for an answer that was lost, a new
        # access token never used; whether it was used is kept past its expiry, so a stolen
        # previous refresh token gets no second life once that token has expired.
        first = await client.login()
        second = assert_json(await client.refresh(first["refresh_token"]))
        await use(fetch, hs, second["access_token"])
        await asyncio.sleep(2.2)  # the used access token expired (and its session with it)
        caplog.set_level(logging.WARNING, logger="homeserver.oauth")
        invalid_grant(await client.refresh(first["refresh_token"]))
        invalid_grant(await client.refresh(second["refresh_token"]))  # the session ended
        assert await hs.devices.list_devices("alice") == []
        assert any("used again" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)

    async def test_revoking_an_expired_access_token_ends_the_session(self, client, fetch, hs):
        # The spec: the server MUST revoke both tokens of the session of the token given, and a
        # client logs out with the access token it holds, expired or not (an app idle a while).
        tokens = await client.login("EXPIREDREV")
        await asyncio.sleep(2.2)
        resp = await client.revoke(tokens["access_token"], token_type_hint="access_token")
        assert resp.status == 200, resp
        invalid_grant(await client.refresh(tokens["refresh_token"]))
        assert await hs.devices.list_devices("alice") == []


async def test_a_sign_in_made_before_a_secret_rotation_is_exchanged(client, hs):
    """The code's fingerprints follow the one rule of every session (Credentials.changed): made
    under the secret that a rotation since made the previous one, they still match; a
    password changed since is still refused."""
    from homeserver.credentials import Credentials

    code, _ = await client.code()
    old = hs.oauth.grants.credentials
    hs.oauth.grants.credentials = Credentials("a rotated secret", [hs.tokens.secret])
    try:
        tokens = assert_json(await client.exchange(code))
        assert_json(await client.refresh(tokens["refresh_token"]))
    finally:
        hs.oauth.grants.credentials = old


async def test_a_password_changed_between_sign_in_and_exchange_is_invalid_grant(client, backend, users_path):
    code, _ = await client.code()
    await edit_users(backend, users_path, with_alice(password=hex_hash("new password")))
    invalid_grant(await client.exchange(code))


async def test_a_replay_sent_the_moment_the_new_access_token_is_answered_is_refused(client, fetch, hs):
    """The new access token's first use is recorded before that request is answered: a replay
    of the old refresh token sent right after (no wait for any background write) is one. Before,
    the use was written in the background, and a replay that came first passed as the retry of a
    lost answer (seen with Synapse in front, on a busy machine)."""
    grants = hs.sessions.grants
    mark = grants.mark_access_used

    async def slow_mark(*args):  # a busy store: the write lands a while after it is asked for
        await asyncio.sleep(0.3)
        await mark(*args)

    grants.mark_access_used = slow_mark
    first = await client.login()
    second = assert_json(await client.refresh(first["refresh_token"]))
    assert_json(await fetch(WHOAMI, token=second["access_token"]))
    assert await hs.oauth.store.access_used("alice", token_digest(second["access_token"]))
    invalid_grant(await client.refresh(first["refresh_token"]))
    await assert_ended(fetch, second["access_token"])
