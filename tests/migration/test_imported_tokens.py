"""A token carried from Synapse is taken wherever one of ours is (whoami, devices, logout,
introspection), with the same session rules: ended, expired, locked, removed user, changed
credential. Its session is planted as the move writes it (ImportedState.add)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from backends.sessions.imported import ImportBatch
from backends.sessions.records import Session
from homeserver.sessions import token_digest
from tests.migration.test_synapse_tokens import synapse_made
from tests.support.delegation_fakes import SECRET
from tests.support.helpers import assert_error, assert_json, record

WHOAMI = "/_matrix/client/v3/account/whoami"
DEVICES = "/_matrix/client/v3/devices"
LOGOUT = "/_matrix/client/v3/logout"
INTROSPECT = "/oauth2/introspect"
FORM = {"Authorization": f"Bearer {SECRET}", "Content-Type": "application/x-www-form-urlencoded"}
MACAROON = "MDAxN2xvY2F0aW9uIGxvY2FsaG9zdAowMDEzaWRlbnRpZmllciBrZXkKMDAxMGNpZCBnZW4gPSAx"


@pytest.fixture
def user_records():
    return [record("alice", "wonderland", " [alice]"), record("bob", "builder"), record("admin", "x", admin=True)]


@pytest.fixture
def config_overrides(synapse):
    return {"delegation": synapse.section()}


def now_ms() -> int:
    return int(time.time() * 1000)


async def plant(hs, token: str, user: str = "alice", device: str = "PHONE", *, expires: int | None = None) -> Session:
    """The session a move makes of a live Synapse token."""
    stored = await hs.users.get(user)
    fingerprint = hs.credentials.of(stored)
    now = now_ms()
    session = Session(token_digest(token), user, device, now, "10.0.0.9", now, expires,
                      identity_fp=fingerprint.identity, password_fp=fingerprint.password)
    await hs.sessions.store.imported().add(
        ImportBatch(sessions=[(session, f"{user}'s {device}")], tokens=[(session.token_hash, user)])
    )
    return session


async def introspect(fetch, token: str) -> dict:
    resp = await fetch(INTROSPECT, "POST", body=f"token={token}&token_type_hint=access_token", headers=FORM)
    assert resp.status == 200, resp
    return resp.json


async def test_a_carried_token_is_the_same_user_and_device_everywhere(fetch, hs):
    token = synapse_made("alice")
    await plant(hs, token)
    whoami = assert_json(await fetch(WHOAMI, token=token))
    assert (whoami["user_id"], whoami["device_id"]) == ("@alice:localhost", "PHONE")
    devices = assert_json(await fetch(DEVICES, token=token))["devices"]
    assert [(d["device_id"], d["display_name"]) for d in devices] == [("PHONE", "alice's PHONE")]
    answer = await introspect(fetch, token)
    assert (answer["active"], answer["username"], answer["device_id"]) == (True, "alice", "PHONE")
    assert "expires_in" not in answer
    assert_json(await fetch(LOGOUT, "POST", token=token))
    assert_error(await fetch(WHOAMI, token=token), 401, "M_UNKNOWN_TOKEN")
    assert (await fetch(WHOAMI, token=token)).json["soft_logout"] is False
    assert await introspect(fetch, token) == {"active": False}


async def test_an_old_synapses_token_is_found_by_its_digest(fetch, hs):
    await plant(hs, MACAROON, "bob", "OLDPHONE")
    whoami = assert_json(await fetch(WHOAMI, token=MACAROON))
    assert (whoami["user_id"], whoami["device_id"]) == ("@bob:localhost", "OLDPHONE")
    assert (await introspect(fetch, MACAROON))["username"] == "bob"


async def test_tokens_never_carried_or_broken_are_refused(fetch, hs):
    await plant(hs, synapse_made("alice"))
    never = synapse_made("alice")  # a good CRC, but no session: never seen (soft logout, as ours)
    assert assert_error(await fetch(WHOAMI, token=never), 401, "M_UNKNOWN_TOKEN")["soft_logout"] is True
    broken = never[:-1] + ("0" if never[-1] != "0" else "1")
    assert assert_error(await fetch(WHOAMI, token=broken), 401, "M_UNKNOWN_TOKEN")["soft_logout"] is False
    assert assert_error(await fetch(WHOAMI, token="MDAxnothing"), 401, "M_UNKNOWN_TOKEN")["soft_logout"] is False
    # A token naming another user finds no session of that user.
    other = synapse_made("bob")
    await plant(hs, other, "alice", "STOLEN")
    assert_error(await fetch(WHOAMI, token=other), 401, "M_UNKNOWN_TOKEN")


async def test_an_expiring_token_says_when_and_expires_as_ours(fetch, hs):
    soon, gone = synapse_made("alice"), synapse_made("alice")
    await plant(hs, soon, device="LAPTOP", expires=now_ms() + 120_000)
    await plant(hs, gone, device="TABLET", expires=now_ms() - 1)
    assert 100 <= (await introspect(fetch, soon))["expires_in"] <= 120
    assert assert_error(await fetch(WHOAMI, token=gone), 401, "M_UNKNOWN_TOKEN")["soft_logout"] is True


async def test_locked_removed_and_changed_users_as_for_ours(fetch, hs, users_path):
    admin_token, alice_token, bob_token = synapse_made("admin"), synapse_made("alice"), synapse_made("bob")
    await plant(hs, admin_token, "admin", "DESK")
    await plant(hs, alice_token)
    await plant(hs, bob_token, "bob", "DESK")
    assert "urn:synapse:admin:*" in (await introspect(fetch, admin_token))["scope"].split()
    path = Path(users_path)
    users = json.loads(path.read_text())["users"]
    users[0]["locked"] = True  # alice locked
    users[1]["password"] = record("bob", "new password")["password"]  # bob's password reset
    users = [u for u in users if u["name"] != "admin"]  # admin removed
    path.write_text(json.dumps({"users": users}))
    await hs.backend.reload()
    assert_error(await fetch(WHOAMI, token=alice_token), 401, "M_USER_LOCKED")
    assert assert_error(await fetch(WHOAMI, token=bob_token), 401, "M_UNKNOWN_TOKEN")["soft_logout"] is False
    assert assert_error(await fetch(WHOAMI, token=admin_token), 401, "M_UNKNOWN_TOKEN")["soft_logout"] is False
    for token in (alice_token, bob_token, admin_token):
        assert await introspect(fetch, token) == {"active": False}


async def test_the_key_of_a_kept_device_is_no_token(fetch, hs):
    # A device the move kept with no live token has a session under `device_digest`, a digest
    # of text anyone can write (the user's name, a device ID other users see in key queries):
    # that text, given as a token, must not open the device's session.
    from urllib.parse import quote

    from homeserver.migration.plan import device_digest

    stored = await hs.users.get("alice")
    fingerprint = hs.credentials.of(stored)
    now = now_ms()
    digest = device_digest("alice", "KEPT")
    session = Session(digest, "alice", "KEPT", now, "10.0.0.9", now, None,
                      identity_fp=fingerprint.identity, password_fp=fingerprint.password)
    await hs.sessions.store.imported().add(ImportBatch(sessions=[(session, "kept")], tokens=[(digest, "alice")]))
    forged = "synapse-device:alice\nKEPT"
    assert token_digest(forged) == digest
    assert_error(await fetch(f"{WHOAMI}?access_token={quote(forged)}"), 401, "M_UNKNOWN_TOKEN")
    assert await introspect(fetch, quote(forged)) == {"active": False}
