"""The OAuth 2.0 API as Synapse's authentication service (a fake Synapse's /_synapse/mas/ API;
the real Synapse behind nginx is tests/oauth_clients/): the token endpoint provisions the user
and the device before it answers, revocation and a removed user delete the device there,
introspection answers OAuth tokens with their device and expires_in."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest

from tests.handlers.test_account_state import edit_users
from tests.support.delegation_fakes import SECRET
from tests.support.helpers import DEFAULT_USERS, assert_json

pytestmark = pytest.mark.usefixtures("io_loop")

FORM = {"Authorization": f"Bearer {SECRET}", "Content-Type": "application/x-www-form-urlencoded"}


@pytest.fixture
def config_overrides(synapse):
    return {"oauth": {"enabled": True}, "delegation": synapse.section(retry_interval=0.1)}


async def introspect(fetch, token: str, **form: str) -> dict:
    resp = await fetch("/oauth2/introspect", "POST", body=urlencode({"token": token, **form}), headers=FORM)
    return assert_json(resp)


async def test_openid_configuration_adds_introspection(fetch):
    body = assert_json(await fetch("/.well-known/openid-configuration"))
    assert body["introspection_endpoint"].endswith("/oauth2/introspect")
    assert body["issuer"].endswith("/") and body["account_management_uri"].endswith("/account/")
    assert body["authorization_endpoint"].endswith("/account/authorize")


async def test_token_endpoint_provisions_and_introspection_answers(client, fetch, synapse):
    tokens = await client.login("SYNAPSE001")
    assert synapse.devices["alice"] == {"SYNAPSE001": "Test App"}
    assert "provision_user" in synapse.names()
    answer = await introspect(fetch, tokens["access_token"])
    assert answer["active"] is True and answer["device_id"] == "SYNAPSE001" and answer["username"] == "alice"
    assert 0 < answer["expires_in"] <= 300
    assert "urn:matrix:client:device:SYNAPSE001" in answer["scope"]
    assert await introspect(fetch, tokens["refresh_token"]) == {"active": False}
    assert await introspect(fetch, tokens["refresh_token"], token_type_hint="refresh_token") == {"active": False}


async def test_revocation_deletes_the_device_at_synapse_before_answering(client, fetch, synapse):
    tokens = await client.login("SYNAPSE002")
    assert "SYNAPSE002" in synapse.devices["alice"]
    assert_json(await client.revoke(tokens["refresh_token"]))
    assert "SYNAPSE002" not in synapse.devices["alice"]
    assert await introspect(fetch, tokens["access_token"]) == {"active": False}


async def test_a_removed_user_ends_at_synapse_at_the_refresh(client, fetch, synapse, backend, users_path):
    tokens = await client.login("SYNAPSE003")
    await edit_users(backend, users_path, [DEFAULT_USERS[1]])
    resp = await client.refresh(tokens["refresh_token"])
    assert resp.status == 400 and resp.json["error"] == "invalid_grant"
    assert "SYNAPSE003" not in synapse.devices["alice"]


async def test_synapse_away_at_the_exchange_is_503_and_no_session(client, fetch, synapse, hs):
    code, _ = await client.code("SYNAPSE004")
    synapse.mode = "error"
    resp = await client.exchange(code)
    assert resp.status == 503 and resp.json["error"] == "temporarily_unavailable", resp
    assert resp.headers.get("Retry-After")
    assert await hs.devices.list_devices("alice") == []
