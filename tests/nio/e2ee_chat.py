"""Two matrix-nio clients with encryption (libolm) talk end-to-end encrypted through a server.

Run by tests/delegation/test_synapse_nio_e2ee.py with the Python of tests/support/nio_e2e.py's virtualenv:
`python e2ee_chat.py URL SENDER PASSWORD RECEIVER PASSWORD STORE_DIR`. Prints one JSON line
of what each side saw. Only nio and the standard library.
"""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.parse
import urllib.request
from pathlib import Path

from nio import (
    AsyncClient,
    AsyncClientConfig,
    JoinResponse,
    LoginResponse,
    MegolmEvent,
    RoomCreateResponse,
    RoomMessageText,
    RoomSendResponse,
    SyncResponse,
)

SERVER_NAME = "localhost"
ENCRYPTION = {"type": "m.room.encryption", "state_key": "", "content": {"algorithm": "m.megolm.v1.aes-sha2"}}


async def client(url: str, name: str, password: str, store: Path) -> AsyncClient:
    """A logged-in client whose device keys are at the server."""
    folder = store / name
    folder.mkdir(parents=True, exist_ok=True)
    config = AsyncClientConfig(encryption_enabled=True, store_sync_tokens=True)
    made = AsyncClient(url, f"@{name}:{SERVER_NAME}", store_path=str(folder), config=config)
    login = await made.login(password, device_name=f"nio e2ee {name}")
    assert isinstance(login, LoginResponse), login
    if made.should_upload_keys:
        await made.keys_upload()
    assert isinstance(await made.sync(timeout=0, full_state=True), SyncResponse)
    return made


async def settle(made: AsyncClient) -> None:
    """One sync, then whatever keys the client now knows it must upload or fetch."""
    response = await made.sync(timeout=0)
    assert isinstance(response, SyncResponse), response
    if made.should_upload_keys:
        await made.keys_upload()
    if made.should_query_keys:
        await made.keys_query()


async def receive(made: AsyncClient, room_id: str, body: str) -> dict[str, object]:
    """Sync until `body` arrives in the room, decrypted; what was seen of it."""
    undecrypted = 0
    for _ in range(30):
        response = await made.sync(timeout=2000)
        assert isinstance(response, SyncResponse), response
        room = response.rooms.join.get(room_id)
        for event in room.timeline.events if room else []:
            if isinstance(event, RoomMessageText) and event.body == body:
                return {"body": event.body, "sender": event.sender, "decrypted": event.decrypted}
            if isinstance(event, MegolmEvent):
                undecrypted += 1
    return {"body": None, "undecrypted": undecrypted}


def on_the_wire(url: str, token: str, room_id: str) -> list[dict[str, object]]:
    """The room's last events as the server holds them (no client decrypting them)."""
    path = f"/_matrix/client/v3/rooms/{urllib.parse.quote(room_id)}/messages?dir=b&limit=50"
    request = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return list(json.loads(answer.read())["chunk"])


async def main(url: str, sender_name: str, sender_pw: str, receiver_name: str, receiver_pw: str, store: str) -> None:
    sender = await client(url, sender_name, sender_pw, Path(store))
    receiver = await client(url, receiver_name, receiver_pw, Path(store))
    try:
        created = await sender.room_create(name="nio e2ee", invite=[receiver.user_id], initial_state=[ENCRYPTION])
        assert isinstance(created, RoomCreateResponse), created
        room_id = created.room_id
        await receiver.sync(timeout=0)
        assert isinstance(await receiver.join(room_id), JoinResponse)
        await settle(receiver)
        await settle(sender)
        sent = await sender.room_send(room_id, "m.room.message", {"msgtype": "m.text", "body": "first secret"},
                                      ignore_unverified_devices=True)
        assert isinstance(sent, RoomSendResponse), sent
        first = await receive(receiver, room_id, "first secret")
        await settle(receiver)
        sent = await receiver.room_send(room_id, "m.room.message", {"msgtype": "m.text", "body": "and back"},
                                        ignore_unverified_devices=True)
        assert isinstance(sent, RoomSendResponse), sent
        reply = await receive(sender, room_id, "and back")
        wire = on_the_wire(url, receiver.access_token, room_id)
        said = [e["type"] for e in wire if e["type"] in ("m.room.message", "m.room.encrypted")]
        text = json.dumps(wire)
        print(json.dumps({
            "encrypted_room": sender.rooms[room_id].encrypted,
            "devices": [sender.device_id, receiver.device_id],
            "first": first,
            "reply": reply,
            "wire_types": sorted(set(said)),
            "messages_on_the_wire": len(said),
            "plaintext_on_server": "first secret" in text or "and back" in text,
        }))
    finally:
        await sender.close()
        await receiver.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:7]))
