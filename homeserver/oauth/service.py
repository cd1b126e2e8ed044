"""The OAuth 2.0 API (`hs.oauth`): its endpoints, each built once over the server's services.
No HTTP here (homeserver/handlers/oauth*.py).

| endpoint | module |
| --- | --- |
| registration (RFC 7591) | homeserver.oauth.registration |
| authorization (the sign-in page's request and code) | homeserver.oauth.authorize |
| token (the code, refresh and device code grants) | homeserver.oauth.token |
| revocation (RFC 7009) | homeserver.oauth.revoke |
| device authorization and its page (RFC 8628) | homeserver.oauth.device |

What the token endpoint and revocation share (a grant opened, refreshed, ended) is
homeserver.oauth.grants; the metadata is served from homeserver.documents.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from backends.sessions.oauth import OAuthStore
from homeserver.credentials import Credentials
from homeserver.oauth.authorize import Authorization
from homeserver.oauth.common import AddressLimits, Buckets
from homeserver.oauth.device import DeviceFlow
from homeserver.oauth.grants import Grants
from homeserver.oauth.registration import Registration
from homeserver.oauth.revoke import Revocation
from homeserver.oauth.token import TokenEndpoint
from homeserver.tokens import TokenIssuer

if TYPE_CHECKING:
    from homeserver.delegation import Delegation
    from homeserver.devices import Devices
    from homeserver.users import Users


@dataclass(frozen=True)
class OAuthSettings:
    access_token_lifetime: int
    device_code_lifetime: int = 900  # seconds a device authorization's codes live (RFC 8628)
    issuer: str = "http://127.0.0.1:8008/"  # the metadata's `issuer` (homeserver.oauth.metadata.issuer_of)


class OAuth:
    """The OAuth 2.0 API over the server's users, sessions and devices."""

    def __init__(
        self,
        settings: OAuthSettings,
        store: OAuthStore,
        *,
        buckets: Buckets,
        users: Users,
        devices: Devices,
        credentials: Credentials,
        tokens: TokenIssuer,
        delegation: Delegation | None,
        rate_limited: bool = True,
    ) -> None:
        self.settings = settings
        self.store = store
        self.users = users
        limits = AddressLimits(buckets, rate_limited)
        # Access tokens are the server's JWTs with the OAuth lifetime: the same auth step takes them.
        issuer = TokenIssuer(tokens.secret, settings.access_token_lifetime, previous=tokens.keys[1:])
        self.grants = Grants(
            store, sessions=devices.sessions, devices=devices, users=users, credentials=credentials,
            tokens=issuer, delegation=delegation,
        )
        self.registration = Registration(store, limits)
        self.authorization = Authorization(store, credentials, settings.issuer)
        self.device = DeviceFlow(store, self.grants, limits, settings.device_code_lifetime)
        self.token = TokenEndpoint(store, self.grants, self.device)
        self.revocation = Revocation(store, self.grants)

    @property
    def lifetime(self) -> int:
        return self.settings.access_token_lifetime
