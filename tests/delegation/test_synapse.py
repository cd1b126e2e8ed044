"""This server as the authentication service of a real Synapse, behind a real nginx running
conf/nginx-delegation.conf (tests/support/delegation_stack.py): the routes, a device per login, and
every way a session ends reaching Synapse, even when Synapse was down at the time."""

from __future__ import annotations

import re
import time
import urllib.request
from typing import Any

from tests.support.delegation_stack import SERVER_NAME, DelegationStack, password_of


def wait_for(check: Any, timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def assert_unknown_token(stack: DelegationStack, token: str) -> None:
    status, body = stack.whoami(token)
    assert (status, body["errcode"]) == (401, "M_UNKNOWN_TOKEN"), (status, body)


def test_the_routes_of_the_nginx_file(synapse_stack: DelegationStack) -> None:
    stack = synapse_stack
    # Logins are ours: password only.
    status, flows = stack.call("/_matrix/client/v3/login")
    assert status == 200 and flows == {"flows": [{"type": "m.login.password"}]}, flows
    # No OAuth 2.0 advertised, so clients choose password login.
    for path in ("/_matrix/client/v1/auth_metadata", "/_matrix/client/unstable/org.matrix.msc2965/auth_metadata"):
        status, body = stack.call(path)
        assert (status, body["errcode"]) == (404, "M_UNRECOGNIZED"), (path, status, body)
    status, well_known = stack.call("/.well-known/matrix/client")
    assert status == 200 and well_known["m.homeserver"] == {"base_url": stack.url}, well_known
    assert "org.matrix.msc2965.authentication" not in well_known
    status, support = stack.call("/.well-known/matrix/support")
    assert status == 200 and support["support_page"] == stack.url + "/support.html", support
    with urllib.request.urlopen(stack.url + "/support.html", timeout=10) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/html")
    # Federation's discovery is Synapse's.
    status, server = stack.call("/.well-known/matrix/server")
    assert status == 200 and "m.server" in server, server
    # Everything else is Synapse's: its /versions lists far more than ours.
    status, versions = stack.call("/_matrix/client/versions")
    assert status == 200 and "v1.1" in versions["versions"] and "unstable_features" in versions, versions
    # The internal APIs are not public: Matrix errors from nginx, not HTML.
    for path in ("/_synapse/mas/query_user?localpart=alice", "/oauth2/introspect",
                 "/.well-known/openid-configuration", "/_synapse/admin/v1/server_version"):
        status, body = stack.call(path)
        assert status == 404 and body == {"errcode": "M_UNRECOGNIZED", "error": "Unrecognized request"}, (path, body)
    # The account page (Synapse's account_management_uri) is ours, HTML for people.
    with urllib.request.urlopen(stack.url + "/account/", timeout=10) as resp:
        page = resp.read().decode()
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/html"), resp.headers
        assert "<form" in page and 'name="password"' in page, page[:500]
    # A wrong password is refused here (Synapse has no login at all under delegation: 404).
    status, meta = stack.call("/_matrix/client/v3/login", {"type": "m.login.password", "user": "nobody",
                                                           "password": "x"})
    assert (status, meta["errcode"]) == (403, "M_FORBIDDEN"), meta


def test_every_login_gets_its_own_device_at_synapse(synapse_stack: DelegationStack) -> None:
    stack = synapse_stack
    first, second = stack.login("carol"), stack.login("carol", initial_device_display_name="Carol's phone")
    assert first["user_id"] == f"@carol:{SERVER_NAME}"
    for login in (first, second):
        assert re.fullmatch(r"[A-Z]{10}", login["device_id"]), login
    assert first["device_id"] != second["device_id"]
    for login in (first, second):
        status, whoami = stack.whoami(login["access_token"])
        assert status == 200 and whoami == {"user_id": "@carol:localhost", "is_guest": False,
                                            "device_id": login["device_id"]}, whoami
    expected = sorted([first["device_id"], second["device_id"]])
    assert stack.synapse_devices("carol") == expected == stack.our_devices("carol")
    # Synapse's device list (routed to Synapse) has the display name given at login.
    status, device = stack.call(f"/_matrix/client/v3/devices/{second['device_id']}", token=first["access_token"])
    assert status == 200 and device["display_name"] == "Carol's phone", device
    # And the profile Synapse serves is the one provisioned from our user store.
    status, profile = stack.call("/_matrix/client/v3/profile/%40carol%3Alocalhost", token=first["access_token"])
    assert status == 200 and profile["displayname"] == "Carol [carol]", profile  # the profile rule: name + ident


def test_logout_is_refused_at_synapse_on_the_next_request(synapse_stack: DelegationStack) -> None:
    stack = synapse_stack
    login, other = stack.login("dave"), stack.login("dave")
    assert stack.whoami(login["access_token"])[0] == 200  # Synapse now holds the answer for 2 minutes
    status, body = stack.call("/_matrix/client/v3/logout", {}, login["access_token"])
    assert (status, body) == (200, {}), body
    assert_unknown_token(stack, login["access_token"])
    assert stack.whoami(other["access_token"])[0] == 200
    assert stack.synapse_devices("dave") == [other["device_id"]] == stack.our_devices("dave")


def test_logout_all_is_refused_at_synapse_on_the_next_request(synapse_stack: DelegationStack) -> None:
    stack = synapse_stack
    logins = [stack.login("erin"), stack.login("erin")]
    for login in logins:
        assert stack.whoami(login["access_token"])[0] == 200
    status, body = stack.call("/_matrix/client/v3/logout/all", {}, logins[0]["access_token"])
    assert (status, body) == (200, {}), body
    for login in logins:
        assert_unknown_token(stack, login["access_token"])
    assert stack.synapse_devices("erin") == [] == stack.our_devices("erin")


def test_device_deletion_through_the_proxy_is_refused_at_synapse(synapse_stack: DelegationStack) -> None:
    stack = synapse_stack
    keep, phone, tablet = stack.login("frank"), stack.login("frank"), stack.login("frank")
    for login in (keep, phone, tablet):
        assert stack.whoami(login["access_token"])[0] == 200
    token = keep["access_token"]
    auth = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": "frank"},
            "password": password_of("frank")}
    # DELETE /devices/{id}: routed here (Synapse answers 404 for it under delegation); UIA first.
    path = f"/_matrix/client/v3/devices/{phone['device_id']}"
    status, challenge = stack.call(path, {}, token, method="DELETE")
    assert status == 401 and challenge["flows"] == [{"stages": ["m.login.password"]}], challenge
    status, body = stack.call(path, {"auth": {**auth, "session": challenge["session"]}}, token, method="DELETE")
    assert (status, body) == (200, {}), body
    assert_unknown_token(stack, phone["access_token"])
    # POST /delete_devices: the same.
    status, challenge = stack.call("/_matrix/client/v3/delete_devices", {"devices": [tablet["device_id"]]}, token)
    assert status == 401, challenge
    status, body = stack.call("/_matrix/client/v3/delete_devices",
                              {"devices": [tablet["device_id"]], "auth": {**auth, "session": challenge["session"]}},
                              token)
    assert (status, body) == (200, {}), body
    assert_unknown_token(stack, tablet["access_token"])
    assert stack.whoami(token)[0] == 200
    assert stack.synapse_devices("frank") == [keep["device_id"]] == stack.our_devices("frank")
    # Reading and renaming devices stay with Synapse.
    status, body = stack.call(f"/_matrix/client/v3/devices/{keep['device_id']}", {"display_name": "Desk"}, token,
                              method="PUT")
    assert status == 200, body
    status, devices = stack.call("/_matrix/client/v3/devices", token=token)
    assert status == 200 and [(d["device_id"], d["display_name"]) for d in devices["devices"]] == [
        (keep["device_id"], "Desk")], devices


def keys_of(stack: DelegationStack, token: str, user: str) -> dict[str, Any]:
    status, answer = stack.call("/_matrix/client/v3/keys/query", {"device_keys": {f"@{user}:localhost": []}}, token)
    assert status == 200, answer
    return dict(answer["device_keys"].get(f"@{user}:localhost", {}))


def test_a_login_naming_its_device_keeps_the_device_and_its_keys(synapse_stack: DelegationStack) -> None:
    """MAS's rule: a login naming a device that has a session replaces that session; the
    device, with its encryption keys, stays at Synapse (a client logging in again)."""
    stack = synapse_stack
    first = stack.login("xavier", device_id="XAVIERPHONE")
    device_keys = {
        "user_id": "@xavier:localhost", "device_id": "XAVIERPHONE",
        "algorithms": ["m.olm.v1.curve25519-aes-sha2", "m.megolm.v1.aes-sha2"],
        "keys": {"curve25519:XAVIERPHONE": "c" * 43, "ed25519:XAVIERPHONE": "e" * 43},
        "signatures": {"@xavier:localhost": {"ed25519:XAVIERPHONE": "s" * 86}},
    }
    status, body = stack.call("/_matrix/client/v3/keys/upload", {"device_keys": device_keys}, first["access_token"])
    assert status == 200, body
    again = stack.login("xavier", device_id="XAVIERPHONE")
    assert again["device_id"] == "XAVIERPHONE"
    assert stack.our_devices("xavier") == ["XAVIERPHONE"] == stack.synapse_devices("xavier")
    assert keys_of(stack, again["access_token"], "xavier")["XAVIERPHONE"]["keys"] == device_keys["keys"]
    # The earlier session is over here at once (Synapse may answer from its cache for up to
    # two minutes, as docs/delegation.md says, since the device stays).
    status, body = stack.homeserver_call("/_matrix/client/v3/account/whoami", token=first["access_token"])
    assert (status, body["errcode"]) == (401, "M_UNKNOWN_TOKEN"), body


def test_a_user_removed_from_the_user_store_is_signed_out_at_synapse(synapse_stack: DelegationStack) -> None:
    stack = synapse_stack
    leaving, watcher = stack.login("zoe"), stack.login("yolanda")
    assert stack.whoami(leaving["access_token"])[0] == 200  # cached at Synapse now
    stack.homeserver.remove_users("zoe")
    # The directory sweep (every 0.5 s here; the first that misses the user ends the
    # sessions) deletes the device at Synapse, so the cached answer no longer counts.
    wait_for(lambda: stack.synapse_devices("zoe") == [], what="zoe's device deleted at Synapse")
    assert_unknown_token(stack, leaving["access_token"])
    assert stack.our_devices("zoe") == []
    assert stack.whoami(watcher["access_token"])[0] == 200


def test_cli_revoke_is_refused_at_synapse_on_the_next_request(synapse_stack: DelegationStack) -> None:
    stack = synapse_stack
    one, two, three = stack.login("grace"), stack.login("grace"), stack.login("grace")
    for login in (one, two, three):
        assert stack.whoami(login["access_token"])[0] == 200
    result = stack.homeserver.run_py("sessions", "revoke", "grace", "--device", one["device_id"])
    assert result.returncode == 0, result.stderr
    assert_unknown_token(stack, one["access_token"])
    assert stack.whoami(two["access_token"])[0] == 200
    result = stack.homeserver.run_py("sessions", "revoke", "grace", "--all")
    assert result.returncode == 0, result.stderr
    for login in (two, three):
        assert_unknown_token(stack, login["access_token"])
    assert stack.synapse_devices("grace") == [] == stack.our_devices("grace")


def test_delegation_sync_reports_what_synapse_has(synapse_stack: DelegationStack) -> None:
    stack = synapse_stack
    login = stack.login("victor")
    result = stack.homeserver.run_py("delegation", "sync")
    assert result.returncode == 0, result.stderr
    lines = {line.split(":", 2)[0] + ":" + line.split(":", 2)[1]: line for line in result.stdout.splitlines()}
    assert login["device_id"] in lines["@victor:localhost"], result.stdout
    assert stack.synapse_devices("victor") == [login["device_id"]]
    assert stack.whoami(login["access_token"])[0] == 200


def test_synapse_down_during_a_login_and_a_logout(synapse_stack: DelegationStack) -> None:
    """Synapse stopped: a login is 503 and leaves nothing; a logout ends the session here at
    once and, once Synapse is back, at Synapse too, with no operator step."""
    stack = synapse_stack
    leaving, known = stack.login("ivan"), stack.login("judy")
    assert stack.whoami(leaving["access_token"])[0] == 200
    stack.synapse.stop()
    try:
        # nginx answers for the missing Synapse with a Matrix error, not an HTML page.
        status, body = stack.whoami(leaving["access_token"])
        assert status == 502 and body["errcode"] == "M_UNKNOWN", body
        for user in ("heidi", "judy"):  # a user Synapse never had, and one it has
            status, body = stack.call("/_matrix/client/v3/login", {
                "type": "m.login.password", "identifier": {"type": "m.id.user", "user": user},
                "password": password_of(user)})
            assert (status, body["errcode"]) == (503, "M_UNKNOWN"), body
        assert stack.our_devices("heidi") == [] and stack.our_devices("judy") == [known["device_id"]]
        status, body = stack.call("/_matrix/client/v3/logout", {}, leaving["access_token"])
        assert (status, body) == (200, {}), body
        assert stack.our_devices("ivan") == []
    finally:
        stack.synapse.start()
    # Back: the retry deletes the device at Synapse by itself, and the token is refused.
    wait_for(lambda: stack.synapse_devices("ivan") == [], what="ivan's device deleted at Synapse")
    assert_unknown_token(stack, leaving["access_token"])
    assert stack.synapse_devices("heidi") == [] and stack.synapse_devices("judy") == [known["device_id"]]
    assert stack.whoami(known["access_token"])[0] == 200
    # Logins work again.
    assert stack.whoami(stack.login("heidi")["access_token"])[0] == 200

