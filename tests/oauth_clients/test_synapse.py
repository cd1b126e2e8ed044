"""matrix-js-sdk 43's OAuth client against a real Synapse behind nginx, with this server as
Synapse's authentication service and `[oauth]` on (tests/oauth_clients/stack.py): two people
sign in through the code grant in headless Chromium, make a room and talk end-to-end
encrypted both ways (js-sdk's Rust crypto), go on talking after their access tokens expired
(each client refreshes by itself, Synapse introspecting the new tokens), and one logs out
with two revocations, after which Synapse refuses the token and has no device left; and an
OAuth user's cross-signing reset is approved on our account page (Synapse's `m.oauth` stage).

The proxy is conf/nginx-delegation.conf as shipped: the OAuth endpoints in our metadata must
be routed to us there."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.oauth_clients.node import chromium_person, js_sdk_script, run_flow
from tests.oauth_clients.stack import LIFETIME, OAuthStack
from tests.support.delegation_stack import password_of, serve
from tests.support.synapse import http

SENDER, RECEIVER = "carol", "dave"


@pytest.fixture(scope="module")
def oauth_stack(tmp_path_factory) -> Iterator[OAuthStack]:
    """Skipped with the reason when Synapse or nginx cannot be had, failed for it under CI."""
    yield from serve(OAuthStack, tmp_path_factory.mktemp("oauth-synapse-stack"))


def test_synapse_answers_our_metadata_as_its_own(oauth_stack: OAuthStack) -> None:
    """Synapse (asked directly, not through the proxy) serves our document as its
    auth_metadata; the proxy sends clients to ours; both name the public URL as issuer."""
    status, ours = oauth_stack.call("/_matrix/client/v1/auth_metadata")
    assert status == 200, ours
    assert ours["issuer"] == oauth_stack.url + "/"
    status, synapses = http(oauth_stack.synapse.url + "/_matrix/client/v1/auth_metadata")
    assert status == 200, synapses
    assert synapses["issuer"] == ours["issuer"]
    assert synapses["account_management_uri"] == ours["account_management_uri"]
    for key in ("authorization_endpoint", "token_endpoint", "revocation_endpoint", "registration_endpoint"):
        assert synapses[key] == ours[key], key
        assert ours[key].startswith(oauth_stack.url + "/"), (key, ours[key])


def test_two_oauth_users_chat_encrypted_through_synapse(oauth_stack: OAuthStack, driver) -> None:
    node, script = js_sdk_script()
    out = run_flow(node, script, ["chat", oauth_stack.url, SENDER, RECEIVER, str(LIFETIME)],
                   chromium_person(driver, password_of), timeout=400)
    assert "failed" not in out, (out, oauth_stack.homeserver.log())
    (sender_id, sender_device), (receiver_id, receiver_device) = out["whoami"]
    assert (sender_id, receiver_id) == (f"@{SENDER}:localhost", f"@{RECEIVER}:localhost")
    assert out["state_echoed"] is True
    assert out["encrypted_room"] is True and out["cross_signing_ready"] is True
    assert out["first"] == {"body": "first secret", "wire": "m.room.encrypted", "sender": sender_id, "failed": False}
    assert out["reply"] == {"body": "and back", "wire": "m.room.encrypted", "sender": receiver_id, "failed": False}
    # After the access tokens expired: both refreshed by themselves, still talking.
    assert out["refreshed"] == [True, True]
    assert out["after_refresh"] == {"body": "after refresh", "wire": "m.room.encrypted", "sender": sender_id,
                                    "failed": False}
    assert out["wire_types"] == ["m.room.encrypted"] and out["plaintext_on_server"] is False
    # The receiver's logout (two revocations here) deleted his device at Synapse before it
    # answered: Synapse refuses his token; the sender goes on.
    assert out["after_logout"] == [401, "M_UNKNOWN_TOKEN"]
    assert out["alice_still"] == sender_id
    assert oauth_stack.synapse_devices(RECEIVER) == []
    assert sender_device in oauth_stack.synapse_devices(SENDER)
    assert receiver_device not in oauth_stack.our_devices(RECEIVER)


def test_an_oauth_user_resets_cross_signing_approved_on_our_page(oauth_stack: OAuthStack) -> None:
    """Synapse's `m.oauth` stage (MSC4312) for an OAuth session: the link is our account page
    from our metadata; the person approves there in Chromium; the client's new master key is
    then taken."""
    from tests.delegation.test_synapse_account_page import (
        approve_reset,
        master_key_at_synapse,
        new_master_key,
        upload,
        upload_script,
    )
    from tests.oauth_clients.flow import OAuthClient
    from tests.support.browser import chrome
    from tests.support.js_sdk import install_js_sdk

    user = "erin"
    js = upload_script(*install_js_sdk())
    client = OAuthClient(oauth_stack.url, client_name="cross-signing test")
    token = client.sign_in(user, password_of(user)).access_token
    first = new_master_key()
    assert upload(js, oauth_stack, token, user, first) == {"status": 200}
    second = new_master_key()
    refused = upload(js, oauth_stack, token, user, second)
    assert refused["status"] == 401, refused
    link = refused["data"]["params"]["m.oauth"]["url"]
    assert link.startswith(client.metadata["account_management_uri"]), (link, client.metadata)
    assert "action=org.matrix.cross_signing_reset" in link
    with chrome() as driver:
        approve_reset(driver, link, user)
    assert upload(js, oauth_stack, token, user, second) == {"status": 200}
    assert master_key_at_synapse(oauth_stack, token, user) == [second]


def test_a_user_removed_from_the_directory_is_signed_out_at_synapse(oauth_stack: OAuthStack) -> None:
    """The issue's promise: removed in the store, signed out at Synapse within one access
    token lifetime; the refresh token is refused."""
    import time

    from tests.oauth_clients.flow import OAuthClient
    from tests.support.delegation_stack import REMOVABLE

    client = OAuthClient(oauth_stack.url, client_name="removal test")
    tokens = client.sign_in(REMOVABLE, password_of(REMOVABLE), device_id="REMOVEDDEV")
    assert oauth_stack.whoami(tokens.access_token)[0] == 200
    assert oauth_stack.synapse_devices(REMOVABLE) == ["REMOVEDDEV"]
    oauth_stack.homeserver.remove_users(REMOVABLE)
    deadline = time.monotonic() + LIFETIME
    while oauth_stack.whoami(tokens.access_token)[0] == 200:
        assert time.monotonic() < deadline, "Synapse still takes the removed user's token"
        time.sleep(0.5)
    status, body = oauth_stack.whoami(tokens.access_token)
    assert (status, body["errcode"]) == (401, "M_UNKNOWN_TOKEN"), body
    refused = client.token(grant_type="refresh_token", refresh_token=tokens.refresh_token)
    assert refused.status == 400 and refused.json["error"] == "invalid_grant", refused
    assert oauth_stack.synapse_devices(REMOVABLE) == []
