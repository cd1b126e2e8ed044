"""What the OAuth 2.0 API's endpoints share: the clock, new secrets, a constant-time comparison,
PKCE (RFC 7636), how long things are kept, and the per-address limits in the shared buckets."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import time
from typing import Protocol

from homeserver import base64url
from homeserver.sessions import token_digest

CODE_LIFETIME = 600.0  # seconds an authorization code lives (RFC 6749 4.1.2: 10 minutes at most)
# Seconds a client is kept from its registration or its last sign-in attempt until a sign-in
# through it completes: registration is open, and what nobody signs in through must not
# pile up in the store every login uses.
PENDING_CLIENT = 3600.0
GRANT_IDLE = 90 * 86400.0  # seconds a grant (and its client) is kept without a refresh
MAX_TOKEN = 4096  # longer than any code or token of ours: refused before any digest


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
    """The S256 code challenge of a code verifier (RFC 7636 4.2)."""
    return base64url.encode(hashlib.sha256(verifier.encode("ascii")).digest())


class Buckets(Protocol):
    """The shared rate-limit buckets of the session store (one GCRA step, as LoginLimits uses)."""

    async def rate_limit(self, key: str, interval: float, capacity: float, *, take: bool = True) -> float: ...


def address_key(client_ip: str) -> str:
    """What a per-address limit counts: the address, or for IPv6 its /64 (one host, or one
    customer's network, holds a whole /64)."""
    try:
        address = ipaddress.ip_address(client_ip)
    except ValueError:
        return client_ip
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


class AddressLimits:
    """Limits of the OAuth endpoints in the shared buckets: per address (`[rate_limit] enabled`),
    and for the whole server (always: they bound what anyone can make the store keep)."""

    def __init__(self, buckets: Buckets, enabled: bool = True) -> None:
        self.buckets = buckets
        self.enabled = enabled

    async def wait(self, kind: str, client_ip: str, interval: float, burst: int) -> float:
        """One step of a per-address limit of `kind`: a burst, then one per `interval` seconds;
        the seconds to wait (0: go on)."""
        if not self.enabled:
            return 0.0
        return await self.buckets.rate_limit(f"{kind}:{address_key(client_ip)}", interval, burst * interval)

    async def overall(self, kind: str, interval: float, burst: int) -> float:
        """One step of the whole server's limit of `kind`; the seconds to wait (0: go on)."""
        return await self.buckets.rate_limit(f"{kind}:*", interval, burst * interval)
