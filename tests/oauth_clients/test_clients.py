"""Real OAuth 2.0 clients against this server's OAuth 2.0 API (issue 26), each finding every
endpoint from `GET /_matrix/client/v1/auth_metadata` as the contract says:

- matrix-js-sdk 43 (npm; its OAuth client since PR #5390, as Element Web uses it), the
  person signing in in a headless Chromium: registration, the code grant, a client that
  refreshes by itself after its access token expired, `logout()` as two revocations;
- oauth4webapi 3 (npm), a strict RFC client: discovery, registration, code + PKCE S256,
  refresh, revocation, the person posting the sign-in form over plain HTTP;
- Authlib's RFC 8414 validator on the metadata document;
- the plain-HTTP client of tests/oauth_clients/flow.py with the unstable scope spelling
  that Element X's SDK still sends.
"""

from __future__ import annotations

import json
import re

from tests.oauth_clients.conftest import LIFETIME, OAUTH, PASSWORDS
from tests.oauth_clients.flow import METADATA, UNSTABLE, OAuthClient, request
from tests.oauth_clients.node import chromium_person, http_person, js_sdk_script, oauth4webapi_script, run_flow
from tests.support.servers import ServerProcess

DEVICE_SCOPE = re.compile(r"urn:matrix:client:device:(\S+)")


def password_of(name: str) -> str:
    return PASSWORDS[name]


def test_authlib_validates_the_metadata_document(tmp_path) -> None:
    """RFC 8414 as Authlib reads it, on a server with an https public URL (as deployed:
    Authlib, like the RFC, wants https everywhere)."""
    try:
        from authlib.oauth2.rfc8414 import AuthorizationServerMetadata
    except ImportError:
        from tests.support.browser import missing

        missing("Authlib is not installed (pip install -r requirements-dev.txt)")
    server = ServerProcess(tmp_path, 1, OAUTH, base_url="https://matrix.example.org")
    try:
        answer = server.fetch(METADATA)
        assert answer.status == 200, answer
        document = answer.json
        AuthorizationServerMetadata(document).validate()
        assert document["issuer"] == "https://matrix.example.org/"
        # The OpenID well-known path answers the same document (Synapse proxies it).
        well_known = server.fetch("/.well-known/openid-configuration")
        assert well_known.status == 200, well_known
        AuthorizationServerMetadata(well_known.json).validate()
        assert {k: v for k, v in well_known.json.items() if k in document} == document
    finally:
        server.stop()


def test_oauth4webapi_discovers_registers_signs_in_refreshes_and_revokes(oauth_server: ServerProcess) -> None:
    node, script = oauth4webapi_script()
    base = f"http://localhost:{oauth_server.port}"  # the issuer: a loopback host is named so
    out = run_flow(node, script, [base, "alice"], http_person(password_of))
    assert "failed" not in out, out
    assert out["issuer"] == base + "/"
    assert out["endpoints"] == ["authorization_endpoint", "token_endpoint", "revocation_endpoint",
                                "registration_endpoint"]
    assert "S256" in out["code_challenge_methods"] and out["well_known_same"] is True, out
    assert out["rfc8414_same"] is True, out
    assert out["registration_status"] == 201 and out["client_id"] is True
    token = out["token"]
    assert token["token_type"].lower() == "bearer" and token["refresh"] is True, out
    assert 0 < token["expires_in"] <= LIFETIME
    assert sorted(token["scope"].split()) == sorted(["urn:matrix:client:api:*",
                                                     f"urn:matrix:client:device:{out['device_id']}"])
    assert out["whoami"] == [200, "@alice:localhost", out["device_id"]]
    assert out["refresh"] == {"rotated": True, "new_access": True, "expires_in": token["expires_in"]}
    assert out["whoami_refreshed"] == [200, "@alice:localhost", out["device_id"]]
    # Revoking the refresh token ended the session: its access token too.
    assert out["revoked"] is True
    assert out["whoami_after_revoke"][:2] == [401, "M_UNKNOWN_TOKEN"], out
    assert out["refresh_after_revoke"] == "invalid_grant"
    assert out["revoke_unknown"] == 200
    assert out["code_again"] == "invalid_grant"


def test_matrix_js_sdk_in_chromium_refreshes_by_itself_and_logs_out(oauth_server: ServerProcess, driver) -> None:
    node, script = js_sdk_script()
    base = f"http://localhost:{oauth_server.port}"  # the issuer: a loopback host is named so
    pages: list[str] = []
    out = run_flow(node, script, ["flow", base, "bob", str(LIFETIME)], chromium_person(driver, password_of, pages))
    assert "failed" not in out, out
    assert out["metadata"]["issuer"] == base + "/"
    assert out["metadata"]["account_management_uri"], out
    assert out["client_id"] is True and out["state_echoed"] is True
    # Element Web's way: the code and state came in the fragment, not the query.
    assert out["response_mode"] == "fragment" and out["code_in_query"] is False
    # The sign-in page named the client that asked, as registered, the device, and where the
    # browser goes next (dynamic registration makes phishing cheap).
    device = out["device_id"]
    assert pages and "matrix-js-sdk test" in pages[0], pages
    assert device in pages[0] and re.search(r"http://127\.0\.0\.1:\d+/callback", pages[0]), pages
    assert out["token"]["token_type"] == "Bearer" and out["token"]["refresh"] is True
    assert DEVICE_SCOPE.search(out["token"]["scope"]).group(1) == device  # type: ignore[union-attr]
    assert out["whoami"] == ["@bob:localhost", device]
    assert device in out["devices"]
    # Expired: 401 M_UNKNOWN_TOKEN with soft_logout, so the client refreshed by itself, once,
    # and repeated the request on the same device.
    assert out["expired"] == [401, "M_UNKNOWN_TOKEN", True]
    assert out["whoami_after_expiry"] == ["@bob:localhost", device]
    assert out["refresh_calls"] == 1 and out["on_token_refresh"] == 1
    assert out["refreshed"] == {"new_access": True, "new_refresh": True, "expiry": True}
    # logout(): the access and the refresh token revoked, no Matrix /logout; both dead.
    assert out["logout_revocations"] == 2 and out["logout_called_matrix_logout"] is False
    assert out["after_logout"] == [401, "M_UNKNOWN_TOKEN"]
    assert out["refresh_after_logout"][0] == 400 and out["refresh_after_logout"][1] == "invalid_grant", out


def test_the_unstable_scope_spelling_is_answered_in_kind(oauth_server: ServerProcess) -> None:
    """Element X's SDK asks in the MSC2967 spelling; the answer's scope is in the same."""
    client = OAuthClient(f"http://localhost:{oauth_server.port}", client_name="unstable spelling")
    tokens = client.sign_in("alice", "wonderland", device_id="UNSTABLEDEV", spelling=UNSTABLE)
    assert sorted(tokens.scope.split()) == [f"{UNSTABLE}:api:*", f"{UNSTABLE}:device:UNSTABLEDEV"]
    whoami = client.whoami(tokens.access_token)
    assert whoami.status == 200 and json.loads(whoami.body)["device_id"] == "UNSTABLEDEV", whoami
    assert client.revoke(tokens.access_token, "access_token").status == 200
    assert client.whoami(tokens.access_token).status == 401
    # And the unstable discovery path answers the same document.
    unstable = request(f"http://localhost:{oauth_server.port}/_matrix/client/unstable/org.matrix.msc2965/auth_metadata")
    assert unstable.status == 200, unstable
    actions = "account_management_actions_supported"
    assert {k: v for k, v in unstable.json.items() if k != actions} == {
        k: v for k, v in client.metadata.items() if k != actions}
    assert set(client.metadata[actions]) <= set(unstable.json[actions])
