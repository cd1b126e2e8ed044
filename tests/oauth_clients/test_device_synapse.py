"""The device authorization grant and `sessions issue` with a real Synapse behind nginx, this
server its authentication service (tests/oauth_clients/stack.py): a device-flow token and an
operator-issued bot token each send a message through Synapse, and after they are revoked
Synapse refuses them on the next request."""

from __future__ import annotations

import json
import time
import urllib.parse
import uuid

from tests.oauth_clients.device_person import HttpPerson
from tests.oauth_clients.flow import post_form, request
from tests.oauth_clients.stack import OAuthStack
from tests.oauth_clients.test_synapse import oauth_stack  # noqa: F401 - the module's own stack
from tests.support.synapse import http

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
WHOAMI = "/_matrix/client/v3/account/whoami"


def say_something(stack: OAuthStack, token: str, text: str) -> str:
    """A room made and a message sent in it, at Synapse (through nginx); the event id."""
    status, room = stack.call("/_matrix/client/v3/createRoom", {"preset": "private_chat"}, token)
    assert status == 200, room
    path = f"/_matrix/client/v3/rooms/{urllib.parse.quote(room['room_id'])}/send/m.room.message/{uuid.uuid4().hex}"
    status, sent = stack.call(path, {"msgtype": "m.text", "body": text}, token, "PUT")
    assert status == 200 and sent["event_id"].startswith("$"), sent
    return str(sent["event_id"])


def refused_at_synapse(stack: OAuthStack, token: str) -> None:
    status, body = http(stack.synapse.url + WHOAMI, token=token)
    assert (status, body["errcode"]) == (401, "M_UNKNOWN_TOKEN"), body


def test_a_device_flow_token_talks_through_synapse_until_revoked(oauth_stack: OAuthStack) -> None:  # noqa: F811
    stack = oauth_stack
    status, metadata = stack.call("/_matrix/client/v1/auth_metadata")
    assert status == 200 and metadata["device_authorization_endpoint"].startswith(stack.url + "/"), metadata
    registration = request(metadata["registration_endpoint"], json.dumps({
        "client_name": "terminal client", "client_uri": "https://terminal.example.org/", "application_type": "native",
        "token_endpoint_auth_method": "none", "grant_types": [DEVICE_GRANT, "refresh_token"],
    }).encode(), {"Content-Type": "application/json"})
    assert registration.status == 201, registration
    client_id = registration.json["client_id"]
    asked = post_form(metadata["device_authorization_endpoint"], {
        "client_id": client_id, "scope": "urn:matrix:client:api:* urn:matrix:client:device:TERMINALSYN",
    })
    assert asked.status == 200, asked
    codes = asked.json
    poll = {"grant_type": DEVICE_GRANT, "device_code": codes["device_code"], "client_id": client_id}
    assert post_form(metadata["token_endpoint"], poll).json["error"] == "authorization_pending"
    person = HttpPerson("erin", "erin-password")
    done = person.approve(codes["verification_uri_complete"])
    assert "TERMINALSYN" in done and "terminal client" in done
    time.sleep(codes["interval"])
    answer = post_form(metadata["token_endpoint"], poll)
    assert answer.status == 200, (answer, stack.homeserver.log()[-3000:])
    tokens = answer.json
    # Synapse had the user and the device before the answer: the token works there at once.
    status, me = http(stack.synapse.url + WHOAMI, token=tokens["access_token"])
    assert (status, me["user_id"], me["device_id"]) == (200, "@erin:localhost", "TERMINALSYN"), me
    assert "TERMINALSYN" in stack.synapse_devices("erin")
    say_something(stack, tokens["access_token"], "typed a code on my phone")
    revoked = post_form(metadata["revocation_endpoint"], {"token": tokens["refresh_token"], "client_id": client_id})
    assert revoked.status == 200, revoked
    refused_at_synapse(stack, tokens["access_token"])
    assert "TERMINALSYN" not in stack.synapse_devices("erin")


def test_an_issued_bot_token_talks_through_synapse_until_revoked(oauth_stack: OAuthStack) -> None:  # noqa: F811
    stack = oauth_stack
    issued = stack.homeserver.run_py("sessions", "issue", "frank", "--device", "BOTSYN")
    assert issued.returncode == 0, issued.stderr
    token = issued.stdout.splitlines()[0]
    assert issued.stdout == token + "\n"
    status, me = http(stack.synapse.url + WHOAMI, token=token)
    assert (status, me["user_id"], me["device_id"]) == (200, "@frank:localhost", "BOTSYN"), me
    say_something(stack, token, "beep, I am a bot")
    revoked = stack.homeserver.run_py("sessions", "revoke", "frank", "--device", "BOTSYN")
    assert revoked.returncode == 0, revoked.stderr
    refused_at_synapse(stack, token)
    assert "BOTSYN" not in stack.synapse_devices("frank")


def test_the_proxy_does_not_log_user_codes(oauth_stack: OAuthStack) -> None:  # noqa: F811
    """conf/nginx-delegation.conf keeps the approval page's query (the user code) out of its log."""
    assert oauth_stack.nginx is not None
    assert request(oauth_stack.url + "/account/device?user_code=WDJB-MJHT").status == 200
    assert request(oauth_stack.url + "/account/?probe=1").status == 200
    deadline = time.monotonic() + 5
    while "probe=1" not in oauth_stack.nginx.access_log() and time.monotonic() < deadline:
        time.sleep(0.05)
    log = oauth_stack.nginx.access_log()
    assert "probe=1" in log and "WDJB" not in log
