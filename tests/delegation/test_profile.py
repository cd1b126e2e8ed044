"""What Synapse is told of a user besides devices, against the fake Synapse: the lock
(`provision_user`'s `locked`) and a profile changed at Synapse put back by the next login."""

from __future__ import annotations

import asyncio
import time

from tests.delegation.test_delegation import (  # noqa: F401  (fixtures)
    config_overrides,
    delegated,
    delegation_section,
    edit_users,
)


def set_locked(users_path: str, locked: bool) -> None:
    def change(users: list[dict]) -> list[dict]:
        alice = {k: v for k, v in users[0].items() if k != "locked"}
        return [{**alice, "locked": True} if locked else alice, *users[1:]]

    edit_users(users_path, change)


async def until(check, what: str) -> None:
    deadline = time.monotonic() + 5
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


async def test_a_lock_and_an_unlock_reach_synapse_when_the_users_file_is_reloaded(login, synapse, hs, users_path):
    await login()
    assert synapse.users["alice"]["locked"] is False
    set_locked(users_path, True)
    await hs.backend.reload()  # names alice as changed: Synapse is told at once
    await until(lambda: synapse.users["alice"]["locked"] is True, "the lock told to Synapse")
    # The lock alone changed: only the lock is sent (the profile, and the rooms, stay as they are).
    assert synapse.calls[-1] == ("provision_user", {"localpart": "alice", "locked": True})
    set_locked(users_path, False)
    await hs.backend.reload()
    await until(lambda: synapse.users["alice"]["locked"] is False, "the unlock told to Synapse")
    assert synapse.names().count("provision_user") == 3


async def test_the_sweep_tells_synapse_a_lock_no_reload_named(login, synapse, hs, users_path):
    await login()
    await hs.stop()  # as for Redis and LDAP: nothing follows what the account store says changed
    set_locked(users_path, True)
    await hs.backend.reload()
    assert synapse.users["alice"]["locked"] is False
    await hs.devices.sweep_removed_users(hs.users)
    assert synapse.users["alice"]["locked"] is True
    # Nothing changed since: the next sweep tells Synapse nothing.
    calls = len(synapse.calls)
    await hs.devices.sweep_removed_users(hs.users)
    assert "provision_user" not in synapse.names()[calls:]


async def test_a_user_who_never_logged_in_is_not_made_at_synapse_by_a_lock(synapse, hs, users_path):
    set_locked(users_path, True)
    await hs.backend.reload()
    await asyncio.sleep(0.1)
    assert "alice" not in synapse.users and synapse.calls == []


async def test_a_name_set_at_synapse_is_put_back_by_the_next_login(login, synapse):
    await login()
    synapse.users["alice"]["displayname"] = "Queen of Hearts"  # an admin renamed her there
    await login()
    assert synapse.users["alice"]["displayname"] == "Alice [alice]"
    assert synapse.names().count("provision_user") == 2
    await login()  # the same profile on both sides: one read, nothing written
    assert synapse.names().count("provision_user") == 2
    assert synapse.names()[-2:] == ["query_user", "upsert_device"]


async def test_a_display_name_synapse_strips_is_the_same_profile(login, synapse, users_path):
    edit_users(users_path, lambda users: [{**users[0], "display_name": "  Alice  "}, *users[1:]])
    await login()
    synapse.users["alice"]["displayname"] = synapse.users["alice"]["displayname"].strip()  # as Synapse keeps it
    await login()
    assert synapse.names().count("provision_user") == 1
