"""matrix-nio clients (with libolm) across a move of their Synapse to this server, run by
tests/migration/test_switch.py with the Python of tests/support/nio_e2e.py's virtualenv, in two phases:

    python migration_e2ee.py before URL STATE_DIR   # at Synapse: log in, keys, an encrypted room
    python migration_e2ee.py after URL STATE_DIR    # after the switch: the same logins go on

`before`: alice on two devices and bob on one log in (Synapse's own password login), upload
their device keys, make an encrypted room and exchange a message; each client's login, the
`next_batch` it reached and the keys each saw of the others are kept in STATE_DIR/state.json,
its olm account and sessions in its own store beside it.
`after`: each client comes back from its stored login (no new login), syncs on from its
`next_batch`, then bob writes and both of alice's devices decrypt it, and alice's second device
writes back, with the keys each sees of the others unchanged. Prints one JSON line of what was
seen. Only nio and the standard library.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

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
    WhoamiResponse,
)

SERVER_NAME = "localhost"
ENCRYPTION = {"type": "m.room.encryption", "state_key": "", "content": {"algorithm": "m.megolm.v1.aes-sha2"}}
# (name, user, password, device id)
CLIENTS = [
    ("alice_a", "alice", "ﬁsh and chips", "ALICENIOA"),
    ("alice_b", "alice", "ﬁsh and chips", "ALICENIOB"),
    ("bob", "bob", "builder-pw", "BOBNIO"),
]


def config() -> AsyncClientConfig:
    return AsyncClientConfig(encryption_enabled=True, store_sync_tokens=True)


def make(url: str, store: Path, name: str, user: str, device: str) -> AsyncClient:
    folder = store / name
    folder.mkdir(parents=True, exist_ok=True)
    return AsyncClient(url, f"@{user}:{SERVER_NAME}", device_id=device, store_path=str(folder), config=config())


async def settle(client: AsyncClient, **sync: Any) -> SyncResponse:
    response = await client.sync(timeout=0, **sync)
    assert isinstance(response, SyncResponse), response
    if client.should_upload_keys:
        await client.keys_upload()
    if client.should_query_keys:
        await client.keys_query()
    return response


async def receive(client: AsyncClient, room_id: str, body: str) -> dict[str, Any]:
    """Sync until `body` arrives in the room; what was seen of it."""
    undecrypted = 0
    for _ in range(30):
        response = await client.sync(timeout=2000)
        assert isinstance(response, SyncResponse), response
        room = response.rooms.join.get(room_id)
        for event in room.timeline.events if room else []:
            if isinstance(event, RoomMessageText) and event.body == body:
                return {"body": event.body, "sender": event.sender, "decrypted": event.decrypted}
            if isinstance(event, MegolmEvent):
                undecrypted += 1
    return {"body": None, "undecrypted": undecrypted}


def keys_seen(client: AsyncClient) -> dict[str, str]:
    """The ed25519 key of every device this client knows of the other users, by user/device."""
    seen = {}
    for user_id in sorted(client.device_store.users):
        for device_id, device in sorted(client.device_store[user_id].items()):
            seen[f"{user_id}/{device_id}"] = device.ed25519
    return seen


async def before(url: str, store: Path) -> dict[str, Any]:
    clients = {}
    for name, user, password, device in CLIENTS:
        client = make(url, store, name, user, device)
        login = await client.login(password, device_name=f"nio {name}")
        assert isinstance(login, LoginResponse), login
        await settle(client, full_state=True)
        clients[name] = client
    alice, alice_b, bob = clients["alice_a"], clients["alice_b"], clients["bob"]
    try:
        created = await alice.room_create(name="before the move", invite=[bob.user_id], initial_state=[ENCRYPTION])
        assert isinstance(created, RoomCreateResponse), created
        room_id = created.room_id
        await bob.sync(timeout=0)
        assert isinstance(await bob.join(room_id), JoinResponse)
        for client in (bob, alice_b, alice):
            await settle(client)
        sent = await alice.room_send(room_id, "m.room.message", {"msgtype": "m.text", "body": "before the move"},
                                     ignore_unverified_devices=True)
        assert isinstance(sent, RoomSendResponse), sent
        seen = {"bob": await receive(bob, room_id, "before the move"),
                "alice_b": await receive(alice_b, room_id, "before the move")}
        for client in clients.values():
            await settle(client)
        state = {
            "room_id": room_id,
            "clients": {name: {"user_id": c.user_id, "device_id": c.device_id, "access_token": c.access_token,
                               "next_batch": c.next_batch, "keys": keys_seen(c)} for name, c in clients.items()},
        }
        (store / "state.json").write_text(json.dumps(state))
        return {"seen": seen, "devices": [c.device_id for c in clients.values()]}
    finally:
        for client in clients.values():
            await client.close()


async def after(url: str, store: Path) -> dict[str, Any]:
    state = json.loads((store / "state.json").read_text())
    room_id = state["room_id"]
    clients: dict[str, AsyncClient] = {}
    out: dict[str, Any] = {"whoami": {}, "went_on": {}, "keys_unchanged": {}}
    try:
        for name, user, _, device in CLIENTS:
            kept = state["clients"][name]
            client = make(url, store, name, user, device)
            client.restore_login(kept["user_id"], kept["device_id"], kept["access_token"])
            clients[name] = client
            whoami = await client.whoami()
            assert isinstance(whoami, WhoamiResponse), whoami
            out["whoami"][name] = [whoami.user_id, whoami.device_id]
            # On from where it was: an incremental sync, nothing of before again.
            response = await client.sync(timeout=0, since=kept["next_batch"])
            assert isinstance(response, SyncResponse), response
            timeline = response.rooms.join.get(room_id)
            again = [e for e in (timeline.timeline.events if timeline else []) if getattr(e, "body", None)]
            out["went_on"][name] = {"next_batch": bool(response.next_batch), "old_messages_again": len(again)}
            # The room's state for sending (nio keeps none across restarts: one initial sync), then the keys.
            client.next_batch, client.loaded_sync_token = None, ""
            await settle(client, full_state=True)
            out["keys_unchanged"][name] = keys_seen(client) == kept["keys"]
        alice, alice_b, bob = clients["alice_a"], clients["alice_b"], clients["bob"]
        sent = await bob.room_send(room_id, "m.room.message", {"msgtype": "m.text", "body": "after the move"},
                                   ignore_unverified_devices=True)
        assert isinstance(sent, RoomSendResponse), sent
        out["after"] = {"alice_a": await receive(alice, room_id, "after the move"),
                        "alice_b": await receive(alice_b, room_id, "after the move")}
        await settle(alice_b)
        sent = await alice_b.room_send(room_id, "m.room.message", {"msgtype": "m.text", "body": "and back, after"},
                                       ignore_unverified_devices=True)
        assert isinstance(sent, RoomSendResponse), sent
        out["reply"] = await receive(bob, room_id, "and back, after")
        out["keys_after"] = {name: keys_seen(c) == state["clients"][name]["keys"] for name, c in clients.items()}
        return out
    finally:
        for client in clients.values():
            await client.close()


if __name__ == "__main__":
    phase, url, folder = sys.argv[1:4]
    result = asyncio.run(before(url, Path(folder)) if phase == "before" else after(url, Path(folder)))
    print(json.dumps(result))
