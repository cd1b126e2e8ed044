"""The OAuth 2.0 API's service: registration, the authorization codes, and what the token and
revocation endpoints do (homeserver.oauth.grants). No HTTP here.

OAuth sessions are sessions: each access token has its session in the SessionStore (with its
`expires_ts`), and each grant (one device's refresh tokens) a session of its own, opened with
the credential fingerprints of the sign-in, under a digest no token can have. Every way a
session ends (logout, device deletion, `sessions revoke`, a reset, the removed-user sweep)
ends that one too, and a refresh finds it ended.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from backends.base import User
from backends.sessions.base import Session, SessionStore
from backends.sessions.oauth import Grant, OAuthStore
from homeserver import base64url
from homeserver.credentials import Credentials
from homeserver.oauth.authorization import AuthorizationRequest, parse_authorization
from homeserver.oauth.clients import register
from homeserver.oauth.errors import too_many
from homeserver.sessions import token_digest
from homeserver.tokens import TokenIssuer

if TYPE_CHECKING:
    from homeserver.delegation import Delegation
    from homeserver.devices import Devices
    from homeserver.users import Users

logger = logging.getLogger(__name__)

CODE_LIFETIME = 600.0  # seconds an authorization code lives (RFC 6749 4.1.2: 10 minutes at most)
CLIENT_IDLE = 7 * 86400.0  # seconds a client is kept unused
GRANT_IDLE = 90 * 86400.0  # seconds a grant (and its client) is kept without a refresh
# Registrations per client address: a burst, then one per this many seconds.
REGISTER_BURST = 20
REGISTER_INTERVAL = 6.0


def now_ms() -> int:
    return int(time.time() * 1000)


def new_token(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(32)


def grant_session_digest(grant_id: str) -> str:
    """The session-store key of a grant's own session: no token's digest (tokens are JWTs)."""
    return token_digest("oauth-grant:" + grant_id)


def same_text(given: str, kept: str) -> bool:
    """A constant-time comparison of any text (compare_digest takes only ASCII str)."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), kept.encode("utf-8", "surrogatepass"))


def pkce_s256(verifier: str) -> str:
    return base64url.encode(hashlib.sha256(verifier.encode("ascii")).digest())


class Buckets(Protocol):
    """The shared rate-limit buckets of the session store (one GCRA step, as LoginLimits uses)."""

    async def rate_limit(self, key: str, interval: float, capacity: float, *, take: bool = True) -> float: ...


@dataclass(frozen=True)
class OAuthSettings:
    access_token_lifetime: int
    device_code_lifetime: int = 900  # seconds a device authorization's codes live (RFC 8628)


class OAuth:
    """The OAuth 2.0 API over the server's users, sessions and devices."""

    def __init__(
        self,
        settings: OAuthSettings,
        store: OAuthStore,
        *,
        sessions: SessionStore,
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
        self.sessions = sessions
        self.buckets = buckets
        self.users = users
        self.devices = devices
        self.credentials = credentials
        # Access tokens are the server's JWTs with the OAuth lifetime: the same auth step takes them.
        self.tokens = TokenIssuer(tokens.secret, settings.access_token_lifetime, previous=tokens.keys[1:])
        self.delegation = delegation
        self.rate_limited = rate_limited

    @property
    def lifetime(self) -> int:
        return self.settings.access_token_lifetime

    async def limit(self, key: str, interval: float, burst: int) -> float:
        """One step of a per-address limit in the shared buckets: the seconds to wait (0: go on)."""
        if not self.rate_limited:
            return 0.0
        return await self.buckets.rate_limit(key, interval, burst * interval)

    # -- registration -----------------------------------------------------------------

    async def register(self, body: Any, client_ip: str) -> dict[str, Any]:
        """RFC 7591: the registered metadata with its client_id, kept in the store."""
        wait = await self.limit("oauth-register:" + client_ip, REGISTER_INTERVAL, REGISTER_BURST)
        if wait > 0:
            raise too_many("too many registrations from this address", wait)
        metadata = register(body)
        await self.store.add_client(metadata["client_id"], metadata, CLIENT_IDLE)
        logger.info("oauth: client %s registered (%r)", metadata["client_id"], metadata.get("client_name", ""))
        return metadata

    # -- authorization ----------------------------------------------------------------

    async def authorization_request(self, params: dict[str, str]) -> AuthorizationRequest:
        """The checked request (PageError or RedirectError otherwise)."""
        client_id = params.get("client_id")
        client = await self.store.client(client_id) if client_id and len(client_id) <= 64 else None
        return parse_authorization(params, client)

    async def issue_code(self, request: AuthorizationRequest, user: User) -> str:
        """A code for the signed-in person (the sign-in was audited by the login service); the URL
        the browser goes to with it."""
        code = new_token("")
        fingerprint = self.credentials.of(user)
        record = {
            "client_id": request.client_id,
            "client_name": request.client_name,
            "redirect_uri": request.redirect.redirect_uri,
            "code_challenge": request.code_challenge,
            "user": user.name,
            "device_id": request.scope.device_id,
            "scope": request.scope.granted,
            "identity_fp": fingerprint.identity,
            "password_fp": fingerprint.password,
            "created_ts": now_ms(),
        }
        await self.store.add_code(token_digest(code), record, CODE_LIFETIME)
        await self.store.touch_client(request.client_id, CLIENT_IDLE)
        return request.redirect.url({"code": code})

    # -- sessions of grants -------------------------------------------------------------

    def access_session(self, token: str, user: User, device_id: str, ip: str) -> Session:
        now = now_ms()
        fingerprint = self.credentials.of(user)
        return Session(
            token_hash=token_digest(token), user=user.name, device_id=device_id, created_ts=now,
            last_seen_ip=ip, last_seen_ts=now, expires_ts=now + self.lifetime * 1000,
            identity_fp=fingerprint.identity, password_fp=fingerprint.password,
        )

    def grant_session(self, grant_id: str, user: User, device_id: str, ip: str, fps: tuple[str, str]) -> Session:
        now = now_ms()
        return Session(
            token_hash=grant_session_digest(grant_id), user=user.name, device_id=device_id, created_ts=now,
            last_seen_ip=ip, last_seen_ts=now, identity_fp=fps[0], password_fp=fps[1],
        )

    async def ends_device(self, session: Session) -> bool:
        """For a logout (homeserver.devices): whether the session's device is an OAuth grant's,
        whose refresh token must end with it."""
        return await self.store.device_grant(session.user, session.device_id) is not None

    async def forget(self, grant: Grant) -> None:
        await self.store.delete_grant(grant)

