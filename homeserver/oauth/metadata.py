"""The authorization server metadata (RFC 8414) of the Matrix OAuth 2.0 API: every field
`oauth_server_metadata.yaml` (v1.18) requires, our endpoints, and the account page."""

from __future__ import annotations

from typing import Any

AUTHORIZATION_PATH = "/account/authorize"  # under the account page: its cookies reach it
TOKEN_PATH = "/oauth2/token"
REVOCATION_PATH = "/oauth2/revoke"
REGISTRATION_PATH = "/oauth2/registration"
INTROSPECTION_PATH = "/oauth2/introspect"
DEVICE_AUTHORIZATION_PATH = "/oauth2/device"
VERIFICATION_PATH = "/account/device"  # where a person approves a device sign-in (the account page's cookies reach it)
DEVICE_CODE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
ACCOUNT_PATH = "/account/"
# v1.18's names of what the account page does (homeserver.account_page), and MSC4191's older
# names, which the unstable discovery path lists too (the page takes both in `?action=`).
ACCOUNT_ACTIONS = (
    "org.matrix.profile",
    "org.matrix.devices_list",
    "org.matrix.device_view",
    "org.matrix.device_delete",
    "org.matrix.cross_signing_reset",
)
UNSTABLE_ACCOUNT_ACTIONS = ("org.matrix.sessions_list", "org.matrix.session_view", "org.matrix.session_end")
SCOPES = ("urn:matrix:client:api:*", "urn:matrix:org.matrix.msc2967.client:api:*", "openid")


def issuer_of(base_url: str) -> str:
    """The issuer identifier: the base URL with one trailing slash (what Synapse and clients compare)."""
    return base_url.rstrip("/") + "/"


def server_metadata(base_url: str, *, introspection: bool = False, unstable: bool = False) -> dict[str, Any]:
    """The metadata document; with `introspection` (delegation) the endpoint Synapse calls, with
    `unstable` (MSC2965's path) the unstable account action names too."""
    base = base_url.rstrip("/")
    actions = list(ACCOUNT_ACTIONS) + (list(UNSTABLE_ACCOUNT_ACTIONS) if unstable else [])
    document: dict[str, Any] = {
        "issuer": issuer_of(base),
        "authorization_endpoint": base + AUTHORIZATION_PATH,
        "token_endpoint": base + TOKEN_PATH,
        "revocation_endpoint": base + REVOCATION_PATH,
        "registration_endpoint": base + REGISTRATION_PATH,
        "response_types_supported": ["code"],
        "response_modes_supported": ["query", "fragment"],
        # RFC 9207: every authorization response (codes and errors) names its issuer (`iss`).
        "authorization_response_iss_parameter_supported": True,
        "grant_types_supported": ["authorization_code", "refresh_token", DEVICE_CODE_GRANT],
        "device_authorization_endpoint": base + DEVICE_AUTHORIZATION_PATH,
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": ["none"],
        "revocation_endpoint_auth_methods_supported": ["none"],
        "scopes_supported": list(SCOPES),
        "account_management_uri": base + ACCOUNT_PATH,
        "account_management_actions_supported": actions,
    }
    if introspection:
        document["introspection_endpoint"] = base + INTROSPECTION_PATH
    return document
