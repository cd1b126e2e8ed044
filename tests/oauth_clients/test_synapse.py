"""matrix-js-sdk 43's OAuth client against a real Synapse behind nginx, with this server as
Synapse's authentication service and `[oauth]` on (tests/oauth_clients/stack.py): two people
sign in through the code grant in headless Chromium, make a room and talk end-to-end
encrypted both ways (js-sdk's Rust crypto), go on talking after their access tokens expired
(each client refreshes by itself, Synapse introspecting the new tokens), and one logs out
with two revocations, after which Synapse refuses the token and has no device left."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.delegation_stack import password_of
from tests.oauth_clients.node import chromium_person, js_sdk_script, run_flow
from tests.oauth_clients.stack import LIFETIME, OAuthStack
from tests.synapse import http

SENDER, RECEIVER = "carol", "dave"


@pytest.fixture(scope="module")
def oauth_stack(tmp_path_factory) -> Iterator[OAuthStack]:
    """Skipped with the reason when Synapse or nginx cannot be had, failed for it under CI."""
    from tests.helpers import ci
    from tests.nginx import NginxUnavailable
    from tests.synapse import SynapseUnavailable

    try:
        stack = OAuthStack(tmp_path_factory.mktemp("oauth-synapse-stack"))
    except (SynapseUnavailable, NginxUnavailable) as exc:
        if ci():
            pytest.fail(f"{exc} (CI is set: the Synapse tests must run)")
        pytest.skip(str(exc))
    yield stack
    stack.stop()


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
