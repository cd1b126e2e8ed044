"""A login of a user the directory sweep deactivated at Synapse (they had left the user store
and came back): Synapse reactivates them before the session opens, since under delegation it
takes the tokens of deactivated users all the same (../shared/notes/next.md). Against the
fake Synapse; the real one is tests/delegation/test_synapse_lifecycle.py's."""

from __future__ import annotations

import logging

from backends.sessions.delegation import DEACTIVATED
from tests.delegation.test_delegation import (  # noqa: F401  (fixtures)
    config_overrides,
    delegated,
    delegation_section,
)


async def test_a_deactivated_user_logging_in_is_reactivated_before_the_session_opens(login, synapse, hs, caplog):
    await login()
    with caplog.at_level(logging.INFO, logger="homeserver.audit"):
        await hs.delegation.deactivate("alice", "missing from the user store since 2026-01-01 00:00 UTC")
    assert synapse.users["alice"]["deactivated"] is True and synapse.devices["alice"] == {}
    assert await hs.delegation.state.provisioned("alice") == DEACTIVATED
    assert 'audit deactivate user="alice" reason="missing from the user store since' in caplog.text
    calls = len(synapse.calls)
    with caplog.at_level(logging.INFO, logger="homeserver.audit"):
        body = await login()
    names = synapse.names()[calls:]
    # Reactivated first, then given its profile again (the deactivation took its addresses),
    # then the device: all before the login answered.
    assert names[:3] == ["reactivate_user", "provision_user", "upsert_device"], names
    assert synapse.users["alice"]["deactivated"] is False
    assert list(synapse.devices["alice"]) == [body["device_id"]]
    assert await hs.delegation.state.provisioned("alice") not in (None, DEACTIVATED)
    assert 'audit reactivate user="alice" client="127.0.0.1" reason="back in the user store"' in caplog.text


async def test_delegation_sync_of_a_deactivated_user_reactivates_them(login, synapse, hs):
    body = await login()
    await hs.delegation.deactivate("alice", "gone")
    done, devices = await hs.delegation.sync_user("alice", await hs.users.get("alice"))
    # Her session here is still open: Synapse gets its device back too.
    assert (done, devices) == ("reactivated", [body["device_id"]])
    assert synapse.users["alice"]["deactivated"] is False
    assert list(synapse.devices["alice"]) == [body["device_id"]]
