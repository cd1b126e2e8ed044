"""The static response bodies (well-knowns, versions, login flows, capabilities, the support
page, the OAuth server metadata), serialised once."""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from homeserver.config import Config
from homeserver.jsonio import encode_json
from homeserver.oauth.metadata import ACCOUNT_PATH, INTROSPECTION_PATH, server_metadata
from homeserver.sso import IDP_ID, LOGIN_TOKEN_TYPE, SSO_TYPE

ROOM_VERSIONS = {str(v): "stable" for v in range(1, 12)}


@dataclass(frozen=True)
class Documents:
    """The static response bodies, serialised once at start-up."""

    well_known_client: bytes
    well_known_support: bytes
    versions: bytes
    login_flows: bytes
    capabilities: bytes
    support_page: bytes  # HTML: the well-known's support_page
    # The OAuth 2.0 server metadata (homeserver.oauth.metadata), None with `[oauth]` off: at
    # the Matrix paths (`auth_metadata`; MSC2965's with the unstable account actions), and at
    # RFC 8414's and OpenID's well-known paths (with the introspection endpoint under delegation).
    auth_metadata: bytes | None = None
    auth_metadata_unstable: bytes | None = None
    server_metadata: bytes | None = None
    # /.well-known/openid-configuration: the server metadata, or under `[delegation]` alone
    # what Synapse needs (issuer, account page, introspection); None with neither.
    openid_configuration: bytes | None = None

    @classmethod
    def from_config(cls, config: Config) -> Documents:
        server = config.section("server")
        support = config.section("support")
        base_url = server["base_url"].rstrip("/")
        client = {"m.homeserver": {"base_url": server["base_url"]}}
        if server["identity_server_url"]:
            client["m.identity_server"] = {"base_url": server["identity_server_url"]}
        disabled = {"enabled": False}  # the service changes no account
        oauth, delegation = config.get("oauth", "enabled"), config.get("delegation", "enabled")
        metadata = server_metadata(base_url, introspection=delegation) if oauth else None
        openid = metadata
        if metadata is None and delegation:
            openid = {
                "issuer": base_url + "/",
                "account_management_uri": base_url + ACCOUNT_PATH,
                "introspection_endpoint": base_url + INTROSPECTION_PATH,
            }
        return cls(
            well_known_client=encode_json(client),
            well_known_support=encode_json(
                {
                    "contacts": [
                        {
                            "email_address": support["email_address"],
                            "matrix_id": support["matrix_id"],
                            "role": support["role"],
                        }
                    ],
                    "support_page": base_url + "/support.html",
                }
            ),
            versions=encode_json({"versions": ["v1.12"]}),
            login_flows=encode_json(
                login_flows(server["server_name"], browser=bool(config.get("mfa", "enabled") or oauth), oauth=oauth)
            ),
            support_page=support_page(server["server_name"], support),
            capabilities=encode_json(
                {
                    "capabilities": {
                        "m.change_password": disabled,
                        "m.set_displayname": disabled,
                        "m.set_avatar_url": disabled,
                        "m.3pid_changes": disabled,
                        "m.get_login_token": disabled,
                        "m.room_versions": {"default": "10", "available": ROOM_VERSIONS},
                    }
                }
            ),
            auth_metadata=encode_json(server_metadata(base_url)) if oauth else None,
            auth_metadata_unstable=encode_json(server_metadata(base_url, unstable=True)) if oauth else None,
            server_metadata=encode_json(metadata) if metadata is not None else None,
            openid_configuration=encode_json(openid) if openid is not None else None,
        )


def login_flows(server_name: str, *, browser: bool, oauth: bool) -> dict[str, Any]:
    """GET /login's answer: the specification's one `m.login.password` flow; with a browser
    sign-in (`[mfa]` or `[oauth]` on, MSC3824) also `m.login.sso`, with our one identity
    provider (an empty list breaks older clients: cinny#1931, element-android#6827) and, with
    OAuth, `oauth_aware_preferred` (Matrix v1.18; MSC3824's unstable name too), and
    `m.login.token`, which the browser sign-in's redirect carries. `m.login.password` stays:
    clients that cannot open a browser (bots, scripts) keep it, for people without a second factor."""
    flows: list[dict[str, Any]] = [{"type": "m.login.password"}]
    if browser:
        sso: dict[str, Any] = {"type": SSO_TYPE, "identity_providers": [{"id": IDP_ID, "name": server_name}]}
        if oauth:
            sso["oauth_aware_preferred"] = True
            sso["org.matrix.msc3824.delegated_oidc_compatibility"] = True
        flows += [sso, {"type": LOGIN_TOKEN_TYPE}]
    return {"flows": flows}


def support_page(server_name: str, support: dict[str, Any]) -> bytes:
    """A small human page listing the support contacts."""
    email = html.escape(support["email_address"])
    mxid = html.escape(support["matrix_id"])
    role = html.escape(support["role"])
    server = html.escape(server_name)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>Support for {server}</title></head><body>"
        f"<h1>Support for {server}</h1><ul>"
        f"<li>Role: {role}</li>"
        f"<li>E-mail: <a href=\"mailto:{email}\">{email}</a></li>"
        f"<li>Matrix: <a href=\"https://matrix.to/#/{mxid}\">{mxid}</a></li>"
        "</ul></body></html>\n"
    ).encode()
