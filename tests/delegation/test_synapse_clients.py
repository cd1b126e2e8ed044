"""Real Matrix clients through nginx to this server (logins) and a real Synapse (the rest):
matrix-nio and matrix-js-sdk log in, sync, make a room, talk, and log in a second device;
two matrix-js-sdk clients with their Rust crypto talk end-to-end encrypted."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import subprocess
from typing import Any

import pytest
from nio import (
    AsyncClient,
    DeleteDevicesAuthResponse,
    DeleteDevicesResponse,
    DevicesResponse,
    JoinResponse,
    LoginResponse,
    LogoutResponse,
    RoomCreateResponse,
    RoomMessageText,
    RoomSendResponse,
    SyncResponse,
    WhoamiError,
)

from tests.support.delegation_stack import DelegationStack, password_of
from tests.support.js_sdk import install_js_sdk

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEVICE_ID = re.compile(r"[A-Z]{10}")


@pytest.fixture(scope="session")
def js_chat() -> tuple[str, str]:
    """node and tests/js/chat.mjs copied beside matrix-js-sdk (cached in .venv, as tests/handlers/test_clients.py)."""
    node, cache = install_js_sdk()
    with open(os.path.join(ROOT, "tests", "js", "chat.mjs"), "rb") as fh:
        source = fh.read()
    # Beside node_modules, so that "matrix-js-sdk" resolves; named by its content, as other
    # checkouts share this cache.
    script = os.path.join(cache, f"chat-{hashlib.sha256(source).hexdigest()[:12]}.mjs")
    with open(script, "wb") as fh:
        fh.write(source)
    return node, script


async def run_chat(js_chat: tuple[str, str], mode: str, url: str, sender: str, receiver: str) -> dict[str, Any]:
    node, script = js_chat
    proc = await asyncio.create_subprocess_exec(
        node, script, mode, url, sender, password_of(sender), receiver, password_of(receiver),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 180)
    assert proc.returncode == 0, stderr.decode()[-3000:]
    return dict(json.loads(stdout.decode().strip().splitlines()[-1]))


async def next_message(client: AsyncClient, room_id: str, body: str) -> RoomMessageText:
    """Sync until `body` arrives in the room (nio's own sync, long-polling through nginx)."""
    for _ in range(20):
        response = await client.sync(timeout=3000)
        assert isinstance(response, SyncResponse), response
        room = response.rooms.join.get(room_id)
        for event in room.timeline.events if room else []:
            if isinstance(event, RoomMessageText) and event.body == body:
                return event
    raise AssertionError(f"{body!r} never arrived for {client.user_id}")


async def test_matrix_nio_chats_through_the_proxy(synapse_stack: DelegationStack) -> None:
    url = synapse_stack.url
    olivia, peggy = AsyncClient(url, "@olivia:localhost"), AsyncClient(url, "@peggy:localhost")
    second, peggy_again = AsyncClient(url, "@olivia:localhost"), AsyncClient(url, "@peggy:localhost")
    try:
        for client, name in ((olivia, "olivia"), (peggy, "peggy")):
            login = await client.login(password_of(name), device_name=f"nio {name}")
            assert isinstance(login, LoginResponse), login
            assert DEVICE_ID.fullmatch(login.device_id), login
            assert isinstance(await client.sync(timeout=0), SyncResponse)
        created = await olivia.room_create(name="nio room", invite=["@peggy:localhost"])
        assert isinstance(created, RoomCreateResponse), created
        room_id = created.room_id
        assert isinstance(await peggy.join(room_id), JoinResponse)
        await olivia.sync(timeout=0)  # nio learns the room from its sync
        content = {"msgtype": "m.text", "body": "hello from nio"}
        assert isinstance(await olivia.room_send(room_id, "m.room.message", content), RoomSendResponse)
        event = await next_message(peggy, room_id, "hello from nio")
        assert event.sender == "@olivia:localhost"
        reply = {"msgtype": "m.text", "body": "hello back"}
        assert isinstance(await peggy.room_send(room_id, "m.room.message", reply), RoomSendResponse)
        assert (await next_message(olivia, room_id, "hello back")).sender == "@peggy:localhost"
        # A second login of the same user is a device of its own, at Synapse too.
        login = await second.login(password_of("olivia"), device_name="nio second")
        assert isinstance(login, LoginResponse) and DEVICE_ID.fullmatch(login.device_id), login
        assert login.device_id != olivia.device_id
        devices = await second.devices()
        assert isinstance(devices, DevicesResponse), devices
        assert {d.id: d.display_name for d in devices.devices} == {
            olivia.device_id: "nio olivia", second.device_id: "nio second"}
        # It sees the room and the talk so far.
        assert (await next_message(second, room_id, "hello back")).sender == "@peggy:localhost"
        # Signed out from the first device with nio's delete_devices and its password step
        # (POST /delete_devices, routed to this server): its token is dead at Synapse.
        challenge = await olivia.delete_devices([second.device_id])
        assert isinstance(challenge, DeleteDevicesAuthResponse), challenge
        auth = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": "olivia"},
                "password": password_of("olivia"), "session": challenge.session}
        assert isinstance(await olivia.delete_devices([second.device_id], auth), DeleteDevicesResponse)
        gone = await second.whoami()
        assert isinstance(gone, WhoamiError) and gone.status_code == "M_UNKNOWN_TOKEN", gone
        # Logging out (routed to this server) kills the token at Synapse too.
        third = await peggy_again.login(password_of("peggy"))
        assert isinstance(third, LoginResponse) and third.device_id != peggy.device_id, third
        token = peggy_again.access_token
        assert isinstance(await peggy_again.logout(), LogoutResponse)
        peggy_again.access_token = token
        gone = await peggy_again.whoami()
        assert isinstance(gone, WhoamiError) and gone.status_code == "M_UNKNOWN_TOKEN", gone
        assert (await olivia.whoami()).device_id == olivia.device_id
        assert (await peggy.whoami()).device_id == peggy.device_id
    finally:
        for client in (olivia, peggy, second, peggy_again):
            await client.close()


async def test_matrix_js_sdk_chats_through_the_proxy(synapse_stack: DelegationStack, js_chat) -> None:
    out = await run_chat(js_chat, "plain", synapse_stack.url, "rupert", "sybil")
    # js-sdk's getAuthMetadata (what Element Web asks first) finds no OAuth 2.0 server, so
    # password login it is, from this server's flows.
    assert out["auth_metadata"] == [404, "M_UNRECOGNIZED"] and out["flows"] == ["m.login.password"]
    assert out["encrypted_room"] is False
    assert out["first"] == {"body": "first secret", "wire": "m.room.message", "sender": "@rupert:localhost",
                            "failed": False}
    assert out["reply"]["sender"] == "@sybil:localhost" and out["reply"]["wire"] == "m.room.message"
    first, second = out["devices"]
    assert DEVICE_ID.fullmatch(first) and DEVICE_ID.fullmatch(second) and first != second
    assert out["device_list"] == sorted([first, second])
    assert out["second_on_bob"]["body"] == out["second_on_bob2"]["body"] == "second secret"
    assert out["after_logout"] == [401, "M_UNKNOWN_TOKEN"]


async def test_end_to_end_encryption_with_matrix_js_sdk_rust_crypto(synapse_stack: DelegationStack, js_chat) -> None:
    out = await run_chat(js_chat, "e2ee", synapse_stack.url, "mallory", "niaj")
    assert out["encrypted_room"] is True
    # Cross-signing bootstrapped as Element does at a first login (no password step exists
    # under delegation; Synapse takes the first upload without one).
    assert out["cross_signing_ready"] is True
    # Sent encrypted, decrypted by the other side, both ways.
    assert out["first"] == {"body": "first secret", "wire": "m.room.encrypted", "sender": "@mallory:localhost",
                            "failed": False}
    assert out["reply"] == {"body": "and back", "wire": "m.room.encrypted", "sender": "@niaj:localhost",
                            "failed": False}
    # Synapse holds ciphertext only.
    assert out["wire_types"] == ["m.room.encrypted"] and out["plaintext_on_server"] is False
    # niaj's second login is a device of its own with keys of its own, which the sender sees
    # as they are, and a message sent after it decrypts on both devices.
    first, second = out["devices"]
    assert first != second and out["device_list"] == sorted([first, second])
    own = out["own_keys"]
    assert own[0][0] != own[1][0] and own[0][1] != own[1][1]
    assert out["keys_seen_by_alice"] == own
    for device in ("second_on_bob", "second_on_bob2"):
        assert out[device] == {"body": "second secret", "wire": "m.room.encrypted", "sender": "@mallory:localhost",
                               "failed": False}
    assert out["after_logout"] == [401, "M_UNKNOWN_TOKEN"]
