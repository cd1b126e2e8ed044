"""The device authorization grant (RFC 8628, Matrix v1.18): a program without a browser asks
for a sign-in, a person approves it on our page (homeserver.handlers.oauth_device_pages) by typing
the short user code, and the program, polling the token endpoint, gets its tokens.

- The device code is 256 random bits; the user code 8 letters of RFC 8628's unambiguous
  alphabet (20 consonants, about 34.6 bits), shown XXXX-XXXX and read without regard to case,
  dashes or spaces. Both are kept as SHA-256 digests only and found by their digest (what a
  lookup's timing could tell is about the digest, never the code: the constant-time way to
  compare secrets with a store), and never written to a log (the access log redacts
  `user_code` and `device_code`).
- Requests for codes, and codes typed on the page, are rate-limited per client address in
  the shared buckets. A person's decision is taken once; an approval is used once.
- Polling sooner than `interval` after the previous poll is `slow_down`; a code past its life
  is `expired_token` (it is remembered for a while after, then unknown: `invalid_grant`).
- The scope rules are the code grant's (homeserver.oauth.scopes); the tokens are opened as
  the code grant opens them (homeserver.oauth.grants, `Grants.open`), after reading the user
  again, so a user changed or locked since the approval gets nothing. When they cannot be
  opened for a while (Synapse or a store away: 503), the approval stands for the next poll.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from typing import Any

from backends.base import StoreUnavailable, User
from backends.sessions.oauth import APPROVED, DENIED, PENDING, USED, DeviceAuthorization, OAuthStore
from homeserver.errors import MatrixError, PageError
from homeserver.oauth.clients import display_name
from homeserver.oauth.common import PENDING_CLIENT, AddressLimits, new_token, now_ms, same_text
from homeserver.oauth.errors import (
    ACCESS_DENIED,
    INVALID_CLIENT,
    TEMPORARILY_UNAVAILABLE,
    UNAUTHORIZED_CLIENT,
    OAuthError,
    invalid_grant,
    invalid_request,
    retry_after,
    too_many,
)
from homeserver.oauth.grants import Grants, Issued, SignIn
from homeserver.oauth.metadata import DEVICE_CODE_GRANT
from homeserver.oauth.scopes import parse_scope
from homeserver.sessions import token_digest

logger = logging.getLogger(__name__)

USER_CODE_ALPHABET = "BCDFGHJKLMNPQRSTVWXZ"  # RFC 8628 6.1: no vowels, no look-alikes
USER_CODE_LENGTH = 8
INTERVAL = 5  # seconds between polls
REMEMBERED = 600.0  # seconds an expired authorization still answers expired_token
MAX_DEVICE_CODE = 128
# Per client address, a burst then one per interval: requests for codes, and codes typed.
AUTHORIZE_BURST, AUTHORIZE_INTERVAL = 20, 6.0
TYPED_BURST, TYPED_INTERVAL = 10, 6.0
# Requests for codes for the whole server, whatever their addresses (each is kept until it
# expires): a burst, then one per interval.
GLOBAL_BURST, GLOBAL_INTERVAL = 200, 0.5

EXPIRED_TOKEN = "expired_token"
AUTHORIZATION_PENDING = "authorization_pending"
SLOW_DOWN = "slow_down"

def new_user_code() -> str:
    return "".join(secrets.choice(USER_CODE_ALPHABET) for _ in range(USER_CODE_LENGTH))


def shown(code: str) -> str:
    """A user code as people read it: XXXX-XXXX."""
    half = len(code) // 2
    return f"{code[:half]}-{code[half:]}"


def normalize(typed: str) -> str | None:
    """A typed user code without case, dashes or spaces; None when it cannot be one."""
    code = "".join(c for c in typed.upper() if c not in "- \t")
    if len(code) != USER_CODE_LENGTH or any(c not in USER_CODE_ALPHABET for c in code):
        return None
    return code


def _digest(code: str) -> str:
    return token_digest("oauth-user-code:" + code)


class DeviceFlow:
    """The device authorization endpoint, the page's steps and the token endpoint's polls."""

    def __init__(self, store: OAuthStore, grants: Grants, limits: AddressLimits, lifetime: int) -> None:
        self.store = store
        self.grants = grants
        self.limits = limits
        self.lifetime = lifetime  # seconds a device authorization's codes live

    # -- the device authorization endpoint (RFC 8628 3.1, 3.2) ----------------------------

    async def authorize(self, form: dict[str, str], client_ip: str, verification_uri: str) -> dict[str, Any]:
        wait = await self.limits.wait("oauth-device", client_ip, AUTHORIZE_INTERVAL, AUTHORIZE_BURST)
        if wait > 0:
            raise too_many("too many device authorization requests from this address", wait)
        wait = await self.limits.overall("oauth-device", GLOBAL_INTERVAL, GLOBAL_BURST)
        if wait > 0:
            raise too_many("too many device authorization requests on this server: try again later", wait)
        client_id = form.get("client_id", "")
        if not client_id:
            raise invalid_request("client_id is required")
        client = await self.store.client(client_id) if len(client_id) <= 64 else None
        if client is None:
            raise OAuthError(INVALID_CLIENT, "the client is unknown or its registration expired", 401)
        if DEVICE_CODE_GRANT not in client.get("grant_types", []):
            raise OAuthError(UNAUTHORIZED_CLIENT, f"the client did not register the grant type {DEVICE_CODE_GRANT}")
        scope = parse_scope(form.get("scope"))
        device_code = new_token("mhd_")
        expires = now_ms() + self.lifetime * 1000
        record = {
            "client_id": client_id, "client_name": display_name(client),
            "client_uri": str(client.get("client_uri", "")), "device_id": scope.device_id,
            "scope": scope.granted, "expires_ts": expires,
        }
        for _ in range(8):  # a user code already live is drawn again
            user_code = new_user_code()
            if await self.store.add_device_code(
                token_digest(device_code), _digest(user_code), record, self.lifetime + REMEMBERED
            ):
                break
        else:
            raise OAuthError(TEMPORARILY_UNAVAILABLE, "no free user code: try again", 503, {"Retry-After": "1"})
        await self.store.touch_client(client_id, PENDING_CLIENT)
        logger.info("oauth: device authorization requested by client %s for device %s", client_id, scope.device_id)
        return {
            "device_code": device_code,
            "user_code": shown(user_code),
            "verification_uri": verification_uri,
            "verification_uri_complete": f"{verification_uri}?user_code={shown(user_code)}",
            "expires_in": self.lifetime,
            "interval": INTERVAL,
        }

    # -- the page ---------------------------------------------------------------------------

    async def find(self, typed: str, client_ip: str) -> DeviceAuthorization:
        """The pending authorization of a typed user code; PageError otherwise (rate-limited
        per address, as every typed code counts)."""
        wait = await self.limits.wait("oauth-user-code", client_ip, TYPED_INTERVAL, TYPED_BURST)
        if wait > 0:
            raise PageError(
                429, "Too many codes were tried from your address. Wait a minute and try again.", retry_after(wait)
            )
        code = normalize(typed)
        found = await self.store.device_code_by_user_code(_digest(code)) if code else None
        if found is None or code is None:
            raise PageError(
                400, "That code is not right, or it has expired. Check it on your device and type it again."
            )
        if now_ms() > int(found.record["expires_ts"]):
            raise PageError(400, "That code has expired. Start the sign-in again on your device.")
        if found.state != PENDING:
            raise PageError(400, "That code was used already. Start the sign-in again on your device if you need to.")
        return found

    async def decide(
        self, found: DeviceAuthorization, user: User, allow: bool, client_ip: str, *, second_factor: str = ""
    ) -> bool:
        """The person's answer (`second_factor`: the one their browser session passed, for the
        grant's sessions); False when the code was answered (or expired) meanwhile."""
        if now_ms() > int(found.record["expires_ts"]):
            return False
        if allow:
            fingerprint = self.grants.credentials.of(user)
            decision = {
                "user": user.name, "identity_fp": fingerprint.identity, "password_fp": fingerprint.password,
                "ip": client_ip, "ts": now_ms(), "second_factor": second_factor,
            }
        else:
            decision = {"user": user.name, "ts": now_ms()}
        done = await self.store.decide_device_code(found.device_hash, APPROVED if allow else DENIED, decision)
        if done:
            logger.info(
                "oauth: %s %s the device sign-in of client %s, device %s", user.name,
                "allowed" if allow else "denied", found.record["client_id"], found.record["device_id"],
            )
        return done

    # -- the token endpoint (RFC 8628 3.4, 3.5) ---------------------------------------------

    async def poll(self, form: dict[str, str], client_ip: str) -> Issued:
        device_code = form.get("device_code", "")
        client_id = form.get("client_id", "")
        if not device_code:
            raise invalid_request("device_code is required")
        if not client_id:
            raise invalid_request("client_id is required")
        digest = token_digest(device_code)
        found = (
            await self.store.poll_device_code(digest, now_ms(), INTERVAL * 1000)
            if len(device_code) <= MAX_DEVICE_CODE else None
        )
        if found is None:
            raise invalid_grant("the device code is unknown")
        record = found.record
        if not same_text(client_id, str(record["client_id"])):
            raise invalid_grant("the device code was issued to another client")
        if found.state == USED:
            raise invalid_grant("the device code was used already")
        if found.state == DENIED:
            raise OAuthError(ACCESS_DENIED, "the person did not allow the sign-in")
        if now_ms() > int(record["expires_ts"]):
            raise OAuthError(EXPIRED_TOKEN, "the device code has expired: start again")
        if found.too_soon:
            raise OAuthError(SLOW_DOWN, f"poll at most once every {INTERVAL} seconds")
        if found.state == PENDING:
            raise OAuthError(AUTHORIZATION_PENDING, "the person has not answered yet")
        decision = found.decision
        sign_in = SignIn(
            user=decision["user"], device_id=record["device_id"], client_id=record["client_id"],
            client_name=str(record.get("client_name") or ""), scope=record["scope"],
            identity_fp=decision["identity_fp"], password_fp=decision["password_fp"],
            second_factor=str(decision.get("second_factor") or ""),
        )
        try:
            return await self.grants.open(sign_in, "d" + digest[:31], client_ip, "oauth device grant")
        except (StoreUnavailable, MatrixError, OAuthError) as exc:
            status = getattr(exc, "status", 503)
            if status >= 500:  # Synapse or a store away: the approval stands for the next poll
                with contextlib.suppress(StoreUnavailable):
                    await self.store.decide_device_code(digest, APPROVED, decision, expected=USED)
            raise

