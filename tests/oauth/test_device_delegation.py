"""The device grant as Synapse's authentication service (a fake Synapse): the tokens come only
after the user and the device are at Synapse; Synapse away is 503 and the approval stands for
the next poll."""

from __future__ import annotations

import pytest

from homeserver.oauth import device
from tests.oauth.device_helpers import DeviceClient, Person
from tests.oauth.test_delegation import config_overrides  # noqa: F401 - pointed at the fake Synapse
from tests.support.helpers import assert_json

pytestmark = pytest.mark.usefixtures("io_loop")


async def test_synapse_away_at_the_poll_is_503_and_the_approval_stands(fetch, synapse, monkeypatch):
    monkeypatch.setattr(device, "INTERVAL", 0)
    client, person = DeviceClient(fetch), Person(fetch)
    codes = await client.codes("SYNDEVICE")
    await person.approve(codes["verification_uri_complete"])
    synapse.mode = "error"
    away = await client.poll(codes["device_code"])
    assert away.status == 503 and away.json["error"] == "temporarily_unavailable", away
    assert "SYNDEVICE" not in synapse.devices.get("alice", {})
    synapse.mode = "ok"
    tokens = assert_json(await client.poll(codes["device_code"]))
    assert synapse.devices["alice"]["SYNDEVICE"] == "Test App"
    assert tokens["scope"].endswith("device:SYNDEVICE")
    assert (await client.poll(codes["device_code"])).json["error"] == "invalid_grant"
