"""Passkeys (WebAuthn) as a second factor, with py_webauthn: the options the browser's
`navigator.credentials.create()` / `.get()` take, and the checks of what they answer.

The relying party is the server's public base URL: its host is the RP ID, its origin the
only origin accepted. Challenges are single-use and short-lived; this module makes them and
checks an answer against one, and the caller keeps them (FactorStore.add_challenge /
take_challenge), finding the one an answer belongs to by `challenge_key(answer)`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from webauthn import (
    generate_authentication_options,
    generate_registration_options,
    options_to_json,
    verify_authentication_response,
    verify_registration_response,
)
from webauthn.helpers import parse_authentication_credential_json, parse_registration_credential_json
from webauthn.helpers.exceptions import WebAuthnException
from webauthn.helpers.structs import (
    AuthenticatorSelectionCriteria,
    AuthenticatorTransport,
    PublicKeyCredentialDescriptor,
    ResidentKeyRequirement,
    UserVerificationRequirement,
)

from backends.sessions.factors import AUTHENTICATE, REGISTER, WEBAUTHN, Challenge, ChallengePurpose, Factor

# How long the browser asks the person to use their authenticator (a hint, ms), and how long
# the server keeps the challenge: a little longer, for the form's round trip.
TIMEOUT_MS = 120_000
CHALLENGE_LIFETIME_MS = 300_000
# An answer larger than this is no authenticator's (attestation "none": well under 2 KiB).
MAX_ANSWER_BYTES = 32_768
_TRANSPORTS = {t.value for t in AuthenticatorTransport}


class PasskeyError(Exception):
    """An answer that does not pass; the message is safe to log (it holds no answer bytes)."""


class PasskeysUnavailable(Exception):
    """The server's base URL cannot be a WebAuthn relying party (its host is an IP address)."""


@dataclass(frozen=True, slots=True)
class RelyingParty:
    """Who the passkeys are for: `rp_id` (a host name), the origin answers must come from, and
    the name authenticators show."""

    rp_id: str
    origin: str
    name: str

    @classmethod
    def from_base_url(cls, base_url: str, name: str) -> RelyingParty:
        """The relying party of `[server] base_url` (http://localhost is a secure context too)."""
        parts = urlsplit(base_url)
        host = (parts.hostname or "").lower()
        if parts.scheme not in ("http", "https") or not host:
            raise PasskeysUnavailable(f"server.base_url {base_url!r} has no host name")
        try:
            ipaddress.ip_address(host)
        except ValueError:
            pass
        else:
            raise PasskeysUnavailable(
                f"server.base_url {base_url!r}: a WebAuthn relying party cannot be an IP address; give it a host name"
            )
        default = {"http": 80, "https": 443}[parts.scheme]
        port = "" if parts.port in (None, default) else f":{parts.port}"
        return cls(rp_id=host, origin=f"{parts.scheme}://{host}{port}", name=name or host)


@dataclass(frozen=True, slots=True)
class NewPasskey:
    """A verified registration, to be kept as a Factor of kind WEBAUTHN."""

    credential_id: bytes
    public_key: bytes
    sign_count: int
    transports: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PasskeyUse:
    """A verified assertion: which factor, and the authenticator's new counter."""

    factor: Factor
    sign_count: int


def _descriptor(factor: Factor) -> PublicKeyCredentialDescriptor:
    transports = [AuthenticatorTransport(t) for t in factor.transports if t in _TRANSPORTS]
    return PublicKeyCredentialDescriptor(id=factor.credential_id, transports=transports or None)


def _challenge(user: str, purpose: ChallengePurpose, challenge: bytes, now_ms: int | None) -> Challenge:
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return Challenge(user=user, purpose=purpose, challenge=challenge, expires_ts=now + CHALLENGE_LIFETIME_MS)


def registration_options(
    rp: RelyingParty, user: str, display_name: str, user_handle: bytes, factors: Sequence[Factor],
    now_ms: int | None = None,
) -> tuple[str, Challenge]:
    """The options of `navigator.credentials.create()` (JSON, as WebAuthn's
    `parseCreationOptionsFromJSON` takes them) to add a passkey, and the challenge to keep.

    The person's passkeys are excluded (an authenticator holding one says so instead of
    making a second); user verification is preferred, a discoverable credential preferred,
    and any attachment accepted: a phone, a security key or the computer itself.
    """
    options = generate_registration_options(
        rp_id=rp.rp_id,
        rp_name=rp.name,
        user_name=user,
        user_id=user_handle,
        user_display_name=display_name or user,
        timeout=TIMEOUT_MS,
        authenticator_selection=AuthenticatorSelectionCriteria(
            resident_key=ResidentKeyRequirement.PREFERRED,
            user_verification=UserVerificationRequirement.PREFERRED,
        ),
        exclude_credentials=[_descriptor(f) for f in factors if f.kind == WEBAUTHN],
    )
    return options_to_json(options), _challenge(user, REGISTER, options.challenge, now_ms)


def authentication_options(
    rp: RelyingParty, user: str, factors: Sequence[Factor], now_ms: int | None = None
) -> tuple[str, Challenge]:
    """The options of `navigator.credentials.get()` for the sign-in's second step (only the
    person's passkeys allowed), and the challenge to keep."""
    allowed = [_descriptor(f) for f in factors if f.kind == WEBAUTHN]
    if not allowed:
        raise PasskeyError("no passkey to ask for")
    options = generate_authentication_options(
        rp_id=rp.rp_id,
        timeout=TIMEOUT_MS,
        allow_credentials=allowed,
        user_verification=UserVerificationRequirement.PREFERRED,
    )
    return options_to_json(options), _challenge(user, AUTHENTICATE, options.challenge, now_ms)


def _b64url(text: Any) -> bytes:
    if not isinstance(text, str):
        raise PasskeyError("not base64url")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise PasskeyError("not base64url") from None


def _answer(text: str) -> dict[str, Any]:
    if len(text) > MAX_ANSWER_BYTES:
        raise PasskeyError("answer too large")
    try:
        answer = json.loads(text)
    except (ValueError, RecursionError):
        raise PasskeyError("answer is not JSON") from None
    if not isinstance(answer, dict) or not isinstance(answer.get("response"), dict):
        raise PasskeyError("answer is not a public key credential")
    return answer


def challenge_key(answer: str) -> str:
    """The key (Challenge.key) of the challenge an answer claims to answer, to take it from the
    store; the check proper comes after, against the challenge taken."""
    client_data = _b64url(_answer(answer)["response"].get("clientDataJSON"))
    try:
        collected = json.loads(client_data)
    except (ValueError, RecursionError):
        raise PasskeyError("clientDataJSON is not JSON") from None
    if not isinstance(collected, dict):
        raise PasskeyError("clientDataJSON is not an object")
    return hashlib.sha256(_b64url(collected.get("challenge"))).hexdigest()


def _usable(challenge: Challenge, user: str, purpose: ChallengePurpose, now_ms: int | None) -> None:
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if challenge.user != user or challenge.purpose != purpose or challenge.expires_ts <= now:
        raise PasskeyError("challenge expired, or made for another person or step")


def verify_registration(
    rp: RelyingParty, challenge: Challenge, user: str, answer: str, now_ms: int | None = None
) -> NewPasskey:
    """Check the browser's answer to `registration_options` (the JSON of its
    PublicKeyCredential, `toJSON()` shape) against the challenge taken for it."""
    _usable(challenge, user, REGISTER, now_ms)
    try:
        credential = parse_registration_credential_json(_answer(answer))
        verified = verify_registration_response(
            credential=credential,
            expected_challenge=challenge.challenge,
            expected_rp_id=rp.rp_id,
            expected_origin=rp.origin,
        )
    except (WebAuthnException, ValueError, TypeError, KeyError, IndexError) as exc:
        raise PasskeyError(f"registration refused: {type(exc).__name__}: {_reason(exc)}") from None
    transports = tuple(t.value for t in credential.response.transports or ())
    return NewPasskey(
        credential_id=verified.credential_id,
        public_key=verified.credential_public_key,
        sign_count=verified.sign_count,
        transports=transports,
    )


def verify_authentication(
    rp: RelyingParty, challenge: Challenge, user: str, answer: str, factors: Sequence[Factor],
    now_ms: int | None = None,
) -> PasskeyUse:
    """Check the browser's answer to `authentication_options` against the challenge taken for
    it and the person's passkeys (`factors`): which one signed, and its new counter. A
    counter that did not grow (unless the authenticator keeps none: 0) is refused, as a
    cloned authenticator's."""
    _usable(challenge, user, AUTHENTICATE, now_ms)
    try:
        credential = parse_authentication_credential_json(_answer(answer))
    except (WebAuthnException, ValueError, TypeError, KeyError, IndexError) as exc:
        raise PasskeyError(f"assertion refused: {type(exc).__name__}: {_reason(exc)}") from None
    factor = next((f for f in factors if f.kind == WEBAUTHN and f.credential_id == credential.raw_id), None)
    if factor is None:
        raise PasskeyError("assertion refused: not a passkey of this person")
    try:
        verified = verify_authentication_response(
            credential=credential,
            expected_challenge=challenge.challenge,
            expected_rp_id=rp.rp_id,
            expected_origin=rp.origin,
            credential_public_key=factor.public_key,
            credential_current_sign_count=factor.sign_count,
        )
    except (WebAuthnException, ValueError, TypeError, KeyError, IndexError) as exc:
        raise PasskeyError(f"assertion refused: {type(exc).__name__}: {_reason(exc)}") from None
    return PasskeyUse(factor=factor, sign_count=verified.new_sign_count)


def _reason(exc: Exception) -> str:
    # py_webauthn's messages name what failed (origin, RP ID hash, challenge, counter) and
    # quote at most the origin the browser reported; cut, so no answer can fill a log line.
    return str(exc)[:200]
