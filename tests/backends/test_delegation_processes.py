"""Delegation in real `run.py` processes (two workers, sessions on Redis) against the fake
Synapse: logins, introspection, logout, and a sign-out Synapse missed landing after our
server restarted and Synapse came back, with no operator step."""

from __future__ import annotations

import json
import secrets
import urllib.error
import urllib.request

import pytest

from tests.support.delegation_fakes import SECRET, FakeSynapseThread
from tests.support.redis_servers import wait_until

LOGIN = "/_matrix/client/v3/login"


@pytest.fixture
def synapse():
    fake = FakeSynapseThread()
    yield fake
    fake.close()


def introspect(port: int, token: str) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/oauth2/introspect",
        data=f"token={token}&token_type_hint=access_token".encode(),
        headers={"Authorization": f"Bearer {SECRET}", "Content-Type": "application/x-www-form-urlencoded"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def test_two_workers_on_redis_and_a_sign_out_synapse_missed(start, synapse, redis_url):
    extra = (
        f'[sessions]\nstore = "redis"\n[sessions.redis]\nurl = "{redis_url}"\n'
        f'key_prefix = "deleg:{secrets.token_hex(4)}:"\n'
        f'[delegation]\nenabled = true\nsynapse_url = "{synapse.url}"\nsecret = "{SECRET}"\n'
        'admins = ["bob"]\ntimeout = 1.0\nretry_interval = 0.2\n'
    )
    server = start(2, extra)
    body = {"type": "m.login.password", "user": "alice", "password": "wonderland"}
    status, first = server.request(LOGIN, body)
    assert status == 200, first
    status, second = server.request(LOGIN, {**body, "initial_device_display_name": "Laptop"})
    assert status == 200, second
    fake = synapse.fake
    assert fake.names().count("provision_user") == 1  # remembered in the shared store
    assert fake.devices["alice"] == {first["device_id"]: None, second["device_id"]: "Laptop"}
    for _ in range(4):  # whichever worker answers
        status, answer = introspect(server.port, first["access_token"])
        assert status == 200 and answer["active"] is True and answer["device_id"] == first["device_id"]

    status, _ = server.request("/_matrix/client/v3/logout", {}, token=first["access_token"])
    assert status == 200
    # One way to tell Synapse of an end: the devices with a session here (the laptop's).
    assert fake.calls[-1] == ("sync_devices", {"localpart": "alice", "devices": [second["device_id"]]})
    assert fake.devices["alice"] == {second["device_id"]: "Laptop"}
    assert introspect(server.port, first["access_token"]) == (200, {"active": False})

    # Synapse goes away; a sign-out still ends here at once.
    synapse.down()
    status, _ = server.request("/_matrix/client/v3/logout/all", {}, token=second["access_token"])
    assert status == 200
    assert introspect(server.port, second["access_token"]) == (200, {"active": False})
    assert fake.devices["alice"] == {second["device_id"]: "Laptop"}  # Synapse has not heard yet

    # Our server restarts (the mark is in Redis), then Synapse comes back: it lands.
    server.stop()
    server = start(2, extra)
    synapse.up()
    wait_until(lambda: fake.devices["alice"] == {}, 10, "the missed sign-out at Synapse")
    assert ("sync_devices", {"localpart": "alice", "devices": []}) in fake.calls
