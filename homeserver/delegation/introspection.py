"""Token introspection (RFC 7662) as Synapse asks it: the answer for one access token.

On Synapse's hot path (once per token per two minutes per Synapse process): the same
auth step as every request here (signature, user lookup, session check), no bcrypt and
nothing more from the stores.
"""

from __future__ import annotations

import time
from typing import Any

from homeserver.auth import Auth
from homeserver.errors import MatrixError

API_SCOPES = ("urn:matrix:client:api:*", "urn:matrix:org.matrix.msc2967.client:api:*")
DEVICE_SCOPE_PREFIXES = ("urn:matrix:client:device:", "urn:matrix:org.matrix.msc2967.client:device:")
ADMIN_SCOPE = "urn:synapse:admin:*"


def inactive() -> dict[str, Any]:
    return {"active": False}


def scope_of(device_id: str, admin: bool) -> str:
    """The API scope and the device scope, each in the stable and the MSC2967 spelling; Synapse admins one more."""
    scopes = [*API_SCOPES, *(prefix + device_id for prefix in DEVICE_SCOPE_PREFIXES)]
    if admin:
        scopes.append(ADMIN_SCOPE)
    return " ".join(scopes)


async def introspect(auth: Auth, token: str, admins: frozenset[str]) -> dict[str, Any]:
    """`{"active": false}` for any token that is not good; the active answer otherwise.

    A store that cannot answer raises (StoreUnavailable: a 503, which Synapse passes on as
    503), never `active: false`, which would end a good session at Synapse.
    """
    try:
        requester = await auth.requester(token, None)
    except MatrixError as exc:
        if exc.status >= 500:
            raise
        return inactive()
    name = requester.user.name
    answer: dict[str, Any] = {
        "active": True,
        "username": name,
        "sub": name,
        "device_id": requester.device_id,
        "token_type": "access_token",
        "scope": scope_of(requester.device_id, name in admins or requester.user.admin),
    }
    expires_ts = requester.session.expires_ts
    if expires_ts is not None:
        # Whole seconds, rounded down: Synapse refuses the token no later than we do.
        remaining = (expires_ts - int(time.time() * 1000)) // 1000
        if remaining <= 0:
            return inactive()
        answer["expires_in"] = remaining
    return answer
