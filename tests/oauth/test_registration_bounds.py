"""What registrations may cost the session store every login uses (issue 34, finding 4):
metadata bounded in size, registrations bounded for the whole server (not only per address,
and an IPv6 /64 is one address), and a client through which no sign-in completes forgotten
within the hour instead of kept a week."""

from __future__ import annotations

import asyncio

import pytest

from homeserver.oauth import authorize, common, device, registration
from tests.oauth.conftest import REDIRECT
from tests.oauth.test_refusals import oauth_error
from tests.support.helpers import assert_json
from tests.support.page_client import text

pytestmark = pytest.mark.usefixtures("io_loop")


async def test_metadata_is_bounded_in_size(client):
    long_path = "http://127.0.0.1/" + "a" * 900
    oauth_error(await client.register(redirect_uris=[long_path + str(n) for n in range(5)]), "invalid_client_metadata")
    oauth_error(await client.register(redirect_uris=[f"http://127.0.0.1/cb{n}" for n in range(11)]), "invalid_redirect_uri")
    oauth_error(await client.register(redirect_uris=["http://127.0.0.1/" + "a" * 1100]), "invalid_redirect_uri")
    oauth_error(await client.register(policy_uri="https://app.example.org/" + "p" * 1100), "invalid_client_metadata")
    # What clients register stays far below.
    body = assert_json(await client.register(
        redirect_uris=[REDIRECT, "http://[::1]/callback", "org.example.app:/callback"],
        logo_uri="https://app.example.org/logo.png", tos_uri="https://app.example.org/tos",
        policy_uri="https://app.example.org/policy"), 201)
    assert body["client_id"]


class TestBehindAProxy:
    @pytest.fixture
    def config_overrides(self):
        return {"oauth": {"enabled": True}, "server": {"trusted_proxies": ["127.0.0.1"]}}

    async def test_registrations_are_bounded_for_the_whole_server(self, client, monkeypatch):
        monkeypatch.setattr(registration, "GLOBAL_BURST", 3)
        statuses = []
        for n in range(5):  # five addresses, each far from its own limit
            resp = await client.register_from(f"198.51.100.{n + 1}")
            statuses.append(resp.status)
        assert statuses == [201, 201, 201, 429, 429], statuses
        assert "Retry-After" in resp.headers and resp.json["error"] == "temporarily_unavailable"

    async def test_an_ipv6_slash_64_is_one_address(self, client):
        statuses = [(await client.register_from(f"2001:db8:1:2::{n + 1:x}")).status for n in range(registration.REGISTER_BURST + 1)]
        assert statuses[-1] == 429 and statuses[:-1] == [201] * registration.REGISTER_BURST, statuses
        assert (await client.register_from("2001:db8:1:3::1")).status == 201  # another /64

    async def test_device_authorization_requests_are_bounded_for_the_whole_server(self, fetch, monkeypatch):
        from tests.oauth.device_helpers import DeviceClient

        monkeypatch.setattr(device, "GLOBAL_BURST", 2)
        program = DeviceClient(fetch)
        await program.ensure_client()
        statuses = [(await program.ask(client_ip=f"203.0.113.{n + 1}")).status for n in range(3)]
        assert statuses == [200, 200, 429], statuses


async def test_a_client_that_never_signs_in_is_forgotten_within_the_hour(client, monkeypatch):
    assert common.PENDING_CLIENT <= 3600
    monkeypatch.setattr(registration, "PENDING_CLIENT", 0.3)
    monkeypatch.setattr(authorize, "PENDING_CLIENT", 0.3)
    await client.ensure_client()
    await asyncio.sleep(0.6)
    page = await client.authorize_page(await client.params())
    assert page.status == 400 and "not registered" in text(page)


async def test_a_client_through_which_a_sign_in_completed_is_kept(client, monkeypatch):
    monkeypatch.setattr(registration, "PENDING_CLIENT", 0.3)
    monkeypatch.setattr(authorize, "PENDING_CLIENT", 0.3)
    await client.login("KEPT000001")
    await asyncio.sleep(0.6)
    page = await client.authorize_page(await client.params("KEPT000002"))
    assert page.status == 200, page
