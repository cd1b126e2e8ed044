"""Revocation (RFC 7009) by the client the token was issued to (issue 34, finding 8): a client
that names itself and is not the token's client is refused (RFC 7009 2.1, 401 as the Matrix
spec's "not authorized to revoke the token"); one that names no client still revokes (the
Matrix spec: secret scanners report leaked tokens without knowing their client)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tests.oauth.conftest import OAuthClient
from tests.oauth.test_refusals import oauth_error
from tests.support.helpers import assert_error, assert_json

pytestmark = pytest.mark.usefixtures("io_loop")

WHOAMI = "/_matrix/client/v3/account/whoami"


@pytest.fixture
def other(fetch) -> OAuthClient:
    """Another client (registered at its first use)."""
    return OAuthClient(fetch)


@pytest.mark.parametrize("which", ["refresh_token", "access_token"])
async def test_another_clients_token_is_refused_and_stays(client, other, fetch, which, caplog):
    tokens = await client.login("VICTIM0001")
    await other.ensure_client()
    caplog.set_level(logging.WARNING, logger="homeserver.oauth")
    resp = await client.revoke(tokens[which], client_id=other.client_id)
    oauth_error(resp, "unauthorized_client", 401)
    assert any("another client" in r.getMessage() for r in caplog.records)
    assert_json(await client.fetch(WHOAMI, token=tokens["access_token"]))
    fresh = assert_json(await client.refresh(tokens["refresh_token"]))
    # Its own client revokes it.
    assert_json(await client.revoke(fresh[which], client_id=client.client_id))
    oauth_error(await client.refresh(fresh["refresh_token"]), "invalid_grant")


async def test_no_client_id_still_revokes(client, fetch):
    tokens = await client.login("LEAKED0001")
    assert_json(await client.revoke(tokens["access_token"]))
    assert_error(await fetch(WHOAMI, token=tokens["access_token"]), 401, "M_UNKNOWN_TOKEN")
    oauth_error(await client.refresh(tokens["refresh_token"]), "invalid_grant")


async def test_unknown_tokens_are_200_whoever_asks(client, other):
    await client.ensure_client()
    await other.ensure_client()
    assert assert_json(await client.revoke("never-issued", client_id=other.client_id)) == {}


async def test_a_password_sessions_token_is_no_clients(client, other, fetch, login):
    token = (await login(device_id="PASSWORD01"))["access_token"]
    await client.ensure_client()
    await other.ensure_client()
    oauth_error(await client.revoke(token, client_id=other.client_id), "unauthorized_client", 401)
    assert_json(await fetch(WHOAMI, token=token))
    assert_json(await client.revoke(token))  # named by no client: revoked, as before
    assert_error(await fetch(WHOAMI, token=token), 401, "M_UNKNOWN_TOKEN")


class TestShortLifetime:
    @pytest.fixture
    def config_overrides(self):
        return {"oauth": {"enabled": True, "access_token_lifetime": 1}}

    async def test_an_expired_access_token_of_another_client_is_refused(self, client, other):
        tokens = await client.login("EXPIRED001")
        await other.ensure_client()
        await asyncio.sleep(2.2)
        oauth_error(await client.revoke(tokens["access_token"], client_id=other.client_id), "unauthorized_client", 401)
        assert_json(await client.refresh(tokens["refresh_token"]))
