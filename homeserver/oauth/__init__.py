"""The Matrix OAuth 2.0 API (`[oauth]`, docs/oauth.md): discovery, client registration, the
authorization code grant with PKCE, refresh and revocation, over the server's own users,
sessions and devices. No HTTP here (homeserver/handlers/oauth*.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from homeserver.config import Config
from homeserver.oauth.metadata import issuer_of
from homeserver.oauth.service import OAuth, OAuthSettings

if TYPE_CHECKING:
    from backends.sessions.base import SessionStore
    from homeserver.credentials import Credentials
    from homeserver.delegation import Delegation
    from homeserver.devices import Devices
    from homeserver.tokens import TokenIssuer
    from homeserver.users import Users

__all__ = ["OAuth", "OAuthSettings", "build_oauth"]


def build_oauth(
    config: Config,
    store: SessionStore,
    *,
    users: Users,
    devices: Devices,
    credentials: Credentials,
    tokens: TokenIssuer,
    delegation: Delegation | None,
) -> OAuth | None:
    """The OAuth service when `[oauth] enabled`; None otherwise. Its sessions are opened and
    ended through the devices' Sessions service (`devices.sessions`, on `store`)."""
    section = config.section("oauth")
    if not section["enabled"]:
        return None
    return OAuth(
        OAuthSettings(
            access_token_lifetime=section["access_token_lifetime"],
            device_code_lifetime=section["device_code_lifetime"],
            issuer=issuer_of(config.get("server", "base_url")),
        ),
        store.oauth(),
        buckets=store.buckets(),
        users=users,
        devices=devices,
        credentials=credentials,
        tokens=tokens,
        delegation=delegation,
        rate_limited=config.get("rate_limit", "enabled"),
    )
