"""Two requests at once on one code or one session: what the later one finds must hold even
while the earlier one is still making its tokens (under delegation that waits on Synapse)."""

from __future__ import annotations

import asyncio

import pytest

from tests.oauth.test_refusals import oauth_error
from tests.support.helpers import assert_error

pytestmark = pytest.mark.usefixtures("io_loop")

WHOAMI = "/_matrix/client/v3/account/whoami"


async def test_a_code_used_twice_at_once_leaves_no_session(client, fetch, hs, monkeypatch):
    code, _ = await client.code("RACE000001")
    users_get = hs.oauth.users.get
    second_done = asyncio.Event()

    async def slow_get(name):  # the first exchange reads the user again while the second one runs
        await asyncio.wait_for(second_done.wait(), 5)
        return await users_get(name)

    monkeypatch.setattr(hs.oauth.users, "get", slow_get)
    first = asyncio.ensure_future(client.exchange(code))
    await asyncio.sleep(0.05)
    second = await client.exchange(code)
    second_done.set()
    oauth_error(second, "invalid_grant")
    first_resp = await first
    monkeypatch.setattr(hs.oauth.users, "get", users_get)
    if first_resp.status == 200:  # whatever the first made is ended: the code was used twice
        body = assert_error(await fetch(WHOAMI, token=first_resp.json["access_token"]), 401, "M_UNKNOWN_TOKEN")
        assert body["soft_logout"] is False
        oauth_error(await client.refresh(first_resp.json["refresh_token"]), "invalid_grant")
    else:
        oauth_error(first_resp, "invalid_grant")
    assert [d.device_id for d in await hs.devices.list_devices("alice")] == []


@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_session_ended_while_a_refresh_runs_gives_no_working_token(client, fetch, hs, monkeypatch, when):
    # `sessions revoke` lands between the refresh's checks and its write, or between the write and the answer.
    tokens = await client.login("RACE000002")
    refresh_grant = hs.oauth.store.refresh_grant

    async def revoked_around(*args, **kwargs):
        if when == "before":
            await hs.devices.revoke("alice", ["RACE000002"])
        done = await refresh_grant(*args, **kwargs)
        if when == "after":
            await hs.devices.revoke("alice", ["RACE000002"])
        return done

    monkeypatch.setattr(hs.oauth.store, "refresh_grant", revoked_around)
    resp = await client.refresh(tokens["refresh_token"])
    monkeypatch.setattr(hs.oauth.store, "refresh_grant", refresh_grant)
    if resp.status == 200:
        assert when == "after"
        body = assert_error(await fetch(WHOAMI, token=resp.json["access_token"]), 401, "M_UNKNOWN_TOKEN")
        assert body["soft_logout"] is False
    else:
        oauth_error(resp, "invalid_grant")
    assert [d.device_id for d in await hs.devices.list_devices("alice")] == []
    oauth_error(await client.refresh(tokens["refresh_token"]), "invalid_grant")


async def test_a_code_whose_tokens_could_not_be_made_can_be_used_again(client, fetch, hs, monkeypatch):
    # A 503 (the session store or Synapse away a moment) tells the client to retry: the code is
    # not spent by it, as a device grant's approval is not.
    from backends.base import StoreUnavailable

    code, _ = await client.code("RACE000003")
    add_grant = hs.oauth.store.add_grant

    async def down(*args, **kwargs):
        raise StoreUnavailable("down for the test", store="session store")

    monkeypatch.setattr(hs.oauth.store, "add_grant", down)
    oauth_error(await client.exchange(code), "temporarily_unavailable", 503)
    assert [d.device_id for d in await hs.devices.list_devices("alice")] == []
    monkeypatch.setattr(hs.oauth.store, "add_grant", add_grant)
    resp = await client.exchange(code)
    assert resp.status == 200, resp
    tokens = resp.json
    assert (await fetch(WHOAMI, token=tokens["access_token"])).status == 200
    oauth_error(await client.exchange(code), "invalid_grant")  # used now: once


async def test_a_store_failing_midway_at_the_poll_leaves_the_approval_usable(fetch, hs, monkeypatch):
    # The grant's own session was opened before the store failed: the next poll must not
    # collide with what the failed one left behind (before, it was 503 until the code expired).
    from backends.base import StoreUnavailable
    from homeserver.oauth import device
    from tests.oauth.device_helpers import DeviceClient, Person
    from tests.support.helpers import assert_json

    monkeypatch.setattr(device, "INTERVAL", 0)
    client, person = DeviceClient(fetch), Person(fetch)
    codes = await client.codes("MIDWAY0001")
    await person.approve(codes["verification_uri_complete"])
    add_grant = hs.oauth.store.add_grant

    async def down(*args, **kwargs):
        raise StoreUnavailable("down for the test", store="session store")

    monkeypatch.setattr(hs.oauth.store, "add_grant", down)
    oauth_error(await client.poll(codes["device_code"]), "temporarily_unavailable", 503)
    monkeypatch.setattr(hs.oauth.store, "add_grant", add_grant)
    tokens = assert_json(await client.poll(codes["device_code"]))
    assert (await fetch(WHOAMI, token=tokens["access_token"])).status == 200
    assert_json(await client.refresh(tokens["refresh_token"]))


async def test_eight_refreshes_at_once_leave_exactly_one_live_refresh_token(client, fetch, hs):
    # What held in issue 34's review, kept with the rule of finding 2: of eight refreshes of one
    # token at once, the grant ends with exactly one current refresh token among the answers.
    from homeserver.sessions import token_digest
    from tests.support.helpers import assert_json

    tokens = await client.login("RACE000008")
    answers = await asyncio.gather(*(client.refresh(tokens["refresh_token"]) for _ in range(8)))
    assert all(a.status == 200 or a.json["error"] == "invalid_grant" for a in answers), answers
    issued = [a.json["refresh_token"] for a in answers if a.status == 200]
    grant = await hs.oauth.store.device_grant("alice", "RACE000008")
    assert grant is not None
    live = [token for token in issued if token_digest(token) == grant.refresh_hash]
    assert len(live) == 1, (len(issued), len(live))
    fresh = assert_json(await client.refresh(live[0]))
    assert_json(await fetch(WHOAMI, token=fresh["access_token"]))
