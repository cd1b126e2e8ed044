"""The registration endpoint: dynamic client registration (RFC 7591) with the Matrix rules.

Clients are public (`token_endpoint_auth_method` none). Redirect URIs never carry a fragment;
`web` clients use https on the host of their `client_uri` (or a subdomain); `native` clients use
a private-use scheme in reverse-DNS of that host with no authority, or http on the loopback
(`localhost`, `127.0.0.1`, `[::1]`) where any port is accepted at authorization (RFC 8252 7.3).
Registrations are bounded: in size (MAX_METADATA), per address (an IPv6 /64 is one) and for the
whole server (GLOBAL_BURST, GLOBAL_INTERVAL), and kept in the session store: a client through
which no sign-in completes for PENDING_CLIENT; one through which one did, GRANT_IDLE after its
last use; never while it has a session.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
import secrets
import string
from typing import Any
from urllib.parse import SplitResult, urlsplit

from backends.sessions.oauth import OAuthStore
from homeserver.oauth.clients import hidden, host_of, loopback_host
from homeserver.oauth.common import PENDING_CLIENT, AddressLimits
from homeserver.oauth.errors import INVALID_CLIENT_METADATA, INVALID_REDIRECT_URI, OAuthError, too_many
from homeserver.oauth.metadata import DEVICE_CODE_GRANT

logger = logging.getLogger(__name__)

GRANT_TYPES = ("authorization_code", "refresh_token", DEVICE_CODE_GRANT)
MAX_REDIRECT_URIS = 10
MAX_URI = 1024
MAX_NAME = 256
MAX_METADATA = 4096  # bytes of the metadata kept, as JSON (clients register a few hundred)
CLIENT_ID_ALPHABET = string.ascii_uppercase + string.digits
OTHER_URIS = ("logo_uri", "tos_uri", "policy_uri")
# The characters of an RFC 3986 URI (no space, backslash, quote, angle bracket or non-ASCII:
# a browser reads such a URI otherwise than urlsplit does, e.g. `\\` ends the authority).
URI_CHARS = re.compile(r"[A-Za-z0-9._~:/?#\[\]@!$&'()*+,;=%-]+")
# A host a browser reads as urlsplit does: a DNS name or an IP literal (no %-escapes).
HOST = re.compile(r"[a-z0-9_]([a-z0-9._-]*[a-z0-9_])?|[0-9a-f:.]+")  # urlsplit's hostname: lower case, no brackets
# Registrations per client address: a burst, then one per this many seconds.
REGISTER_BURST = 20
REGISTER_INTERVAL = 6.0
# Registrations for the whole server, whatever their addresses: with PENDING_CLIENT and
# MAX_METADATA, at most about 30 MB of clients nobody signed in through.
GLOBAL_BURST = 200
GLOBAL_INTERVAL = 0.5


def metadata_error(description: str) -> OAuthError:
    return OAuthError(INVALID_CLIENT_METADATA, description)


def _split(value: Any, name: str, error: str = INVALID_CLIENT_METADATA) -> SplitResult:
    if not isinstance(value, str) or not value or len(value) > MAX_URI:
        raise OAuthError(error, f"{name} must be a URI of at most {MAX_URI} characters")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        raise OAuthError(error, f"{name} is not a valid URI") from None
    if not parts.scheme or not URI_CHARS.fullmatch(value):
        raise OAuthError(error, f"{name} is not an absolute URI (RFC 3986 characters only)")
    if parts.scheme.lower() in ("http", "https") and not HOST.fullmatch(parts.hostname or ""):
        raise OAuthError(error, f"{name} must name its host as a DNS name or an IP address")
    return parts


def _under(host: str, base: str) -> bool:
    """The same host as `base`, or a subdomain of it."""
    return bool(base) and (host == base or host.endswith("." + base))


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def _check_redirect(uri: Any, application_type: str, base: str) -> str:
    parts = _split(uri, "redirect_uris", INVALID_REDIRECT_URI)
    assert isinstance(uri, str)
    if parts.fragment or "#" in uri:
        raise OAuthError(INVALID_REDIRECT_URI, f"{uri}: a redirect URI must not have a fragment")
    scheme = parts.scheme.lower()
    if scheme == "https":
        if parts.username is not None or parts.password is not None:
            raise OAuthError(INVALID_REDIRECT_URI, f"{uri}: no user or password in a redirect URI")
        if not _under(host_of(parts), base):
            raise OAuthError(INVALID_REDIRECT_URI, f"{uri}: must be on the host of client_uri ({base}) or under it")
        return uri
    if application_type != "native":
        raise OAuthError(INVALID_REDIRECT_URI, f"{uri}: a web client's redirect URIs must use https")
    if scheme == "http":
        if loopback_host(parts.netloc) is None:
            raise OAuthError(INVALID_REDIRECT_URI, f"{uri}: http only on localhost, 127.0.0.1 or [::1]")
        if parts.username is not None:
            raise OAuthError(INVALID_REDIRECT_URI, f"{uri}: no user or password in a redirect URI")
        return uri
    # A private-use scheme: the reverse-DNS of the client_uri host (a domain name: it has a
    # period, RFC 8252 7.1, so never javascript: or data:), with no authority.
    reverse = ".".join(reversed(base.split(".")))
    if not base or _is_ip(base) or "." not in base or not (scheme == reverse or scheme.startswith(reverse + ".")):
        wanted = reverse or "the reverse-DNS of client_uri's host"
        raise OAuthError(INVALID_REDIRECT_URI, f"{uri}: a private-use scheme must start with {wanted}")
    if uri[len(scheme) + 1:].startswith("//"):
        raise OAuthError(INVALID_REDIRECT_URI, f"{uri}: a private-use scheme URI must have no authority (one slash)")
    return uri


def _string(body: dict[str, Any], name: str, limit: int = MAX_URI) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > limit or not _is_text(value):
        raise metadata_error(f"{name} must be a string of at most {limit} characters")
    return value


def _is_text(value: str) -> bool:
    """Whether a JSON string is text (not a lone surrogate from a `\\ud800` escape, which no
    answer could carry)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def client_metadata(body: Any) -> dict[str, Any]:
    """The metadata to keep for a registration request (a JSON object), with a new `client_id`;
    OAuthError `invalid_redirect_uri` or `invalid_client_metadata` when refused."""
    if not isinstance(body, dict):
        raise metadata_error("the registration request must be a JSON object")
    application_type = body.get("application_type", "web")
    if application_type not in ("web", "native"):
        raise metadata_error("application_type must be web or native")
    client_uri = _string(body, "client_uri")
    if client_uri is None:
        raise metadata_error("client_uri is required")
    client_parts = _split(client_uri, "client_uri")
    if client_parts.scheme.lower() != "https" and not (
        client_parts.scheme.lower() == "http" and host_of(client_parts) in ("localhost", "127.0.0.1", "::1")
    ):
        raise metadata_error("client_uri must use https")
    if client_parts.fragment or client_parts.username is not None:
        raise metadata_error("client_uri must have no fragment, user or password")
    base = host_of(client_parts)
    auth_method = body.get("token_endpoint_auth_method", "none")
    if auth_method != "none":
        raise metadata_error("only public clients: token_endpoint_auth_method must be none")
    grant_types = body.get("grant_types", ["authorization_code"])
    if not isinstance(grant_types, list) or not all(isinstance(g, str) for g in grant_types):
        raise metadata_error("grant_types must be a list of strings")
    # A program without a browser registers for the device grant alone: no redirect, no code.
    device_only = DEVICE_CODE_GRANT in grant_types and "authorization_code" not in grant_types
    if "authorization_code" not in grant_types and not device_only:
        raise metadata_error(f"grant_types must include authorization_code or {DEVICE_CODE_GRANT}")
    response_types = body.get("response_types", [] if device_only else ["code"])
    if response_types != ["code"] and not (device_only and response_types == []):
        raise metadata_error("response_types must be [\"code\"]")
    redirect_uris = body.get("redirect_uris", [] if device_only else None)
    if device_only and redirect_uris == []:
        pass
    elif not isinstance(redirect_uris, list) or not redirect_uris or len(redirect_uris) > MAX_REDIRECT_URIS:
        raise OAuthError(INVALID_REDIRECT_URI, f"redirect_uris must list 1 to {MAX_REDIRECT_URIS} URIs")
    metadata: dict[str, Any] = {
        "client_id": "".join(secrets.choice(CLIENT_ID_ALPHABET) for _ in range(26)),
        "application_type": application_type,
        "client_uri": client_uri,
        "redirect_uris": [_check_redirect(uri, application_type, base) for uri in redirect_uris],
        "grant_types": [g for g in GRANT_TYPES if g in grant_types],
        "response_types": [] if device_only else ["code"],
        "token_endpoint_auth_method": "none",
    }
    name = _string(body, "client_name", MAX_NAME)
    if name and any(hidden(c) for c in name):
        # Logged here, shown on pages beside the address and the device's display name: a line
        # break would forge log lines, U+202E reverse what follows it.
        raise metadata_error("client_name must have no control, format (bidirectional) or private-use characters")
    if name:
        metadata["client_name"] = name
    for key in OTHER_URIS:
        value = _string(body, key)
        if value is not None:
            parts = _split(value, key)
            if parts.scheme.lower() not in ("https", "http") or not _under(host_of(parts), base):
                raise metadata_error(f"{key} must be on the host of client_uri")
            metadata[key] = value
    if encoded_size(metadata) > MAX_METADATA:
        raise metadata_error(f"the registration is too large: at most {MAX_METADATA} bytes of metadata")
    return metadata


def encoded_size(metadata: dict[str, Any]) -> int:
    """The bytes a registration takes in the store (its JSON)."""
    return len(json.dumps(metadata).encode("utf-8"))


class Registration:
    """POST /oauth2/registration."""

    def __init__(self, store: OAuthStore, limits: AddressLimits) -> None:
        self.store = store
        self.limits = limits

    async def register(self, body: Any, client_ip: str) -> dict[str, Any]:
        """RFC 7591: the registered metadata with its client_id, kept in the store."""
        wait = await self.limits.wait("oauth-register", client_ip, REGISTER_INTERVAL, REGISTER_BURST)
        if wait > 0:
            raise too_many("too many registrations from this address", wait)
        metadata = client_metadata(body)
        wait = await self.limits.overall("oauth-register", GLOBAL_INTERVAL, GLOBAL_BURST)
        if wait > 0:
            logger.warning("oauth: registrations refused for %.0f s: the server's bound is reached", wait)
            raise too_many("too many registrations on this server: try again later", wait)
        await self.store.add_client(metadata["client_id"], metadata, PENDING_CLIENT)
        logger.info("oauth: client %s registered (%r)", metadata["client_id"], metadata.get("client_name", ""))
        return metadata
