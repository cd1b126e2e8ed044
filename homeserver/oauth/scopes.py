"""Scopes of the Matrix OAuth 2.0 API: exactly one device scope and the API scope, in the stable
(`urn:matrix:client:`) or the unstable MSC2967 (`urn:matrix:org.matrix.msc2967.client:`) spelling,
answered in the spelling asked; `openid` (which older clients add) is taken and ignored."""

from __future__ import annotations

import re
from dataclasses import dataclass

from homeserver.oauth.errors import INVALID_SCOPE, OAuthError

PREFIXES = ("urn:matrix:client:", "urn:matrix:org.matrix.msc2967.client:")
API = "api:*"
DEVICE = "device:"
IGNORED = frozenset({"openid"})
# RFC 3986's unreserved characters (the spec's SHOULD), and the length Synapse takes.
DEVICE_ID = re.compile(r"[A-Za-z0-9._~-]{1,255}")
MAX_SCOPE = 2048


@dataclass(frozen=True, slots=True)
class Scope:
    device_id: str
    granted: str  # the Matrix scope tokens as asked (their spelling), space-separated


def parse_scope(text: str | None) -> Scope:
    """The device a scope names; OAuthError invalid_scope for anything but exactly one device
    scope and the API scope (in either spelling; `openid` ignored)."""
    if not text:
        raise OAuthError(INVALID_SCOPE, "scope is required: the API scope and one device scope")
    if len(text) > MAX_SCOPE:
        raise OAuthError(INVALID_SCOPE, "scope is too long")
    devices: list[tuple[str, str]] = []
    api: list[str] = []
    for token in dict.fromkeys(text.split(" ")):
        if not token or token in IGNORED:
            continue
        prefix = next((p for p in PREFIXES if token.startswith(p)), None)
        rest = token[len(prefix):] if prefix is not None else ""
        if prefix is not None and rest == API:
            api.append(token)
        elif prefix is not None and rest.startswith(DEVICE):
            devices.append((token, rest[len(DEVICE):]))
        else:
            raise OAuthError(INVALID_SCOPE, f"unknown scope {token!r}")
    if len(devices) != 1:
        raise OAuthError(INVALID_SCOPE, f"exactly one device scope is required, {len(devices)} given")
    if not api:
        raise OAuthError(INVALID_SCOPE, "the API scope urn:matrix:client:api:* is required")
    token, device_id = devices[0]
    if not DEVICE_ID.fullmatch(device_id):
        raise OAuthError(INVALID_SCOPE, "the device ID must be 1-255 of A-Z a-z 0-9 - . _ ~")
    return Scope(device_id, " ".join([*api, token]))
