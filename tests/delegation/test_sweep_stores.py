"""The directory sweep over each user store (the users file, a real Redis, a real slapd with the
memberof overlay: tests/backends/listing_stores.py) against the fake Synapse: everyone
provisioned as the profile rules make them, a user taken out of the store signed out here
and deactivated at Synapse, put back and reactivated; a broken record or a store that stops
answering deactivates no one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from homeserver.delegation.provisioning import profile_for_synapse
from tests.backends.listing_stores import NAMES, ListedStore, listed_store


@pytest.fixture(params=["file", "redis", "ldap"])
def store(request, tmp_path) -> Iterator[ListedStore]:
    yield from listed_store(request.param, tmp_path)


async def sweep(hs):
    # The users file here is not polled (reload_interval 0): as at a SIGHUP, the server reads
    # it again, so its lookups (which confirm a user gone) see what the listing sees.
    await hs.backend.reload()
    return await hs.sweeper.sweep_now()


@pytest.fixture
def config_overrides(store, synapse):
    return {**store.overrides, "delegation": synapse.section(sync_interval=3600.0, deactivate_after=0.0)}


async def test_the_sweep_follows_the_store(store, hs, synapse, login):
    await hs.stop()  # only the sweep tells Synapse here
    report = await sweep(hs)
    assert set(synapse.users) == NAMES and report.created == 4
    for name in NAMES:
        user = await hs.users.get(name)
        display, avatar, emails = profile_for_synapse(user)
        told = synapse.users[name]
        assert (told.get("displayname"), told.get("avatar_url"), told.get("emails", [])) == (display, avatar, emails)
        assert told["locked"] is (name == "bob")
    assert synapse.users["carol"]["emails"] == ["carol@example.org"]
    assert (await sweep(hs)).unchanged == 4

    await login("dave", "secret")
    store.remove("dave")
    report = await sweep(hs)
    assert (report.deactivated, report.sessions_ended) == (1, 1)
    assert synapse.users["dave"]["deactivated"] is True and await hs.sessions.store.devices("dave") == []
    store.restore("dave")
    report = await sweep(hs)
    assert report.reactivated == 1 and synapse.users["dave"]["deactivated"] is False
    assert (await login("dave", "secret"))["user_id"] == "@dave:localhost"


@pytest.mark.parametrize("store", ["redis", "ldap"], indirect=True)
async def test_a_broken_record_or_a_store_gone_quiet_deactivates_no_one(store, hs, synapse):
    await hs.stop()
    await sweep(hs)
    store.break_record("carol")
    report = await sweep(hs)
    assert report.guard == "incomplete" and report.deactivated == 0 and report.unchanged == 3
    store.stop()
    report = await sweep(hs)
    assert report.guard == "incomplete" and report.deactivated == 0
    assert not any(user.get("deactivated") for user in synapse.users.values())
