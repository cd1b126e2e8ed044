"""HS256 access tokens (compact JWS via python-jose) and the server-held signing secret."""

from __future__ import annotations

import binascii
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass

from jose import jwt
from jose.exceptions import ExpiredSignatureError, JOSEError, JWTClaimsError

from backends.secret_file import SecretFileMissing, read_secret_file
from homeserver import base64url
from homeserver.config import Config
from homeserver.errors import ConfigError

logger = logging.getLogger(__name__)

# Always a list: python-jose treats a string as a substring allow-list ("HS2" passes).
ALGORITHMS = ["HS256"]

# Verified tokens are remembered this many seconds (and never past their own `exp`), so
# authenticated requests skip python-jose's decode (~60 us, most of a request's cost).
# Only the signature check is cached: every request still looks its user up, so a deleted
# user's token fails at once. A token is the cache key, so a tampered one never hits.
TOKEN_CACHE_TTL = 60.0
# Bounds memory (~0.5 KB an entry) under a flood of distinct valid tokens.
TOKEN_CACHE_SIZE = 10_000
# Past this a text is no token of ours (the largest: a 255-byte name and a 512-character
# device id, each escaped 6-fold in JSON, in base64url): refused before any decoding.
MAX_TOKEN_LENGTH = 8192
# A header or payload with more brackets than this is no token of ours (ours have one
# object each and no nesting): refused before a JSON parser recurses into it.
MAX_BRACKETS = 8
_SEGMENT = re.compile(r"[A-Za-z0-9_-]+")
# A JSON string, or an unterminated one to the end of the text (possessive and always
# matching from its quote, so the search is linear whatever the text).
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*+(?:"|\\?\Z)', re.DOTALL)


class TokenError(Exception):
    """The token is malformed, tampered, signed otherwise, or expired."""


class TokenExpired(TokenError):
    """A token with a good signature whose `exp` has passed (clients keep the device: soft logout)."""


@dataclass(frozen=True, slots=True)
class Claims:
    name: str
    device_id: str


class TokenIssuer:
    """Signs and verifies access tokens with one secret."""

    def __init__(
        self,
        secret: str,
        lifetime: int = 0,
        cache_ttl: float = TOKEN_CACHE_TTL,
        cache_size: int = TOKEN_CACHE_SIZE,
        previous: Sequence[str] = (),
    ) -> None:
        self.secret = secret
        # Secrets from before a rotation: tokens they signed still verify (new ones never
        # use them). The verified-token cache lives in the process, so a restart without a
        # secret forgets its tokens at once.
        self.keys = [secret, *(key for key in previous if key != secret)]
        self.lifetime = lifetime
        self.cache_ttl = cache_ttl
        self.cache_size = cache_size
        # token -> (claims, monotonic deadline, wall-clock exp or None)
        self._cache: dict[str, tuple[Claims, float, float | None]] = {}

    def issue(self, name: str, device_id: str) -> str:
        """Sign the claims `sub` and `device_id` (plus `exp` when a lifetime is set), with a fresh nonce."""
        claims: dict[str, object] = {"sub": name, "device_id": device_id}
        if self.lifetime:
            claims["exp"] = int(time.time()) + self.lifetime
        # The claims are fixed by the specification, so what makes each login's token
        # distinct (and so its session, keyed by the token's digest) is a random value in
        # the protected header: 96 bits, never repeated in practice.
        header = {"alg": ALGORITHMS[0], "nonce": secrets.token_urlsafe(12), "typ": "JWT"}
        # Byte for byte what python-jose's jwt.encode makes (its header sorted, its claims as
        # given, HMAC-SHA256), without its key construction: a third of a refresh grant's work.
        signing_input = base64url.encode(
            json.dumps(header, separators=(",", ":"), sort_keys=True).encode("utf-8")
        ) + "." + base64url.encode(json.dumps(claims, separators=(",", ":")).encode("utf-8"))
        signature = hmac.new(self.secret.encode("utf-8"), signing_input.encode("ascii"), hashlib.sha256).digest()
        return signing_input + "." + base64url.encode(signature)

    def verify(self, token: str) -> Claims:
        """Return the claims of a valid token; TokenError for anything else."""
        now = time.monotonic()
        hit = self._cache.get(token)
        if hit is not None:
            claims, deadline, exp = hit
            if now < deadline:
                # The same rule as python-jose: expired once the whole second is past exp.
                if exp is not None and int(time.time()) > exp:
                    del self._cache[token]
                    raise TokenExpired("Signature has expired.")
                return claims
            del self._cache[token]
        claims, exp = self._decode(token)
        if self.cache_ttl > 0:
            if len(self._cache) >= self.cache_size:
                # Drop the oldest entry (dicts keep insertion order).
                del self._cache[next(iter(self._cache))]
            self._cache[token] = (claims, now + self.cache_ttl, exp)
        return claims

    def claims_of_expired(self, token: str) -> Claims | None:
        """The claims of a token whose one fault is its expiry (signed by us); None otherwise.
        Only to end what an expired token belongs to (OAuth revocation), never to authorize."""
        try:
            return self._decode(token, verify_exp=False)[0]
        except TokenError:
            return None

    def _decode(self, token: str, *, verify_exp: bool = True) -> tuple[Claims, float | None]:
        """The full check: shape first (size, alphabet, a small JSON object in each of the
        first two segments), then signature, algorithm, claims and expiry (python-jose).
        Whatever the text, the answer is claims or TokenError (so a 401), never another error."""
        check_shape(token)
        first_error: Exception | None = None
        for key in self.keys:
            try:
                claims = jwt.decode(token, key, algorithms=ALGORITHMS, options={"verify_exp": verify_exp})
                break
            except (JOSEError, UnicodeError) as exc:  # UnicodeError: text that is no token at all
                # A claims error means this key's signature matched: that is the answer.
                if first_error is None or isinstance(exc, (ExpiredSignatureError, JWTClaimsError)):
                    first_error = exc
            except Exception as exc:  # the shape check let through what the decoder chokes on
                logger.debug("token refused by the decoder: %r", exc)
                raise TokenError("malformed token") from None
        else:
            if isinstance(first_error, ExpiredSignatureError):
                raise TokenExpired(str(first_error)) from None
            raise TokenError(str(first_error)) from None
        name, device_id = claims.get("sub"), claims.get("device_id")
        if not isinstance(name, str) or not isinstance(device_id, str):
            raise TokenError("token lacks sub or device_id")
        exp = claims.get("exp")
        return Claims(name, device_id), float(exp) if isinstance(exp, (int, float)) else None


def check_shape(token: str) -> None:
    """TokenError unless `token` is three base64url segments within MAX_TOKEN_LENGTH whose first
    two decode to a JSON object with at most MAX_BRACKETS brackets outside its strings.

    Cheap (C-level regex, base64 and count over a few hundred bytes) and done before the
    decoder, which would otherwise recurse into deeply nested JSON (RecursionError: a 500
    and a traceback for every such request).
    """
    if not isinstance(token, str) or len(token) > MAX_TOKEN_LENGTH:
        raise TokenError("token too long")
    parts = token.split(".")
    if len(parts) != 3 or not all(_SEGMENT.fullmatch(part) for part in parts):
        raise TokenError("not a compact JWS")
    for part in parts[:2]:
        _small_object(part)


def _small_object(segment: str) -> dict[str, object]:
    if len(segment) % 4 == 1:
        raise TokenError("not base64url")
    try:
        text = base64url.decode(segment).decode("utf-8")
    except (binascii.Error, ValueError):  # UnicodeDecodeError is a ValueError
        raise TokenError("not base64url of UTF-8") from None
    bare = _JSON_STRING.sub("", text)  # the structure, strings left out
    if not bare.lstrip().startswith("{") or bare.count("{") + bare.count("[") > MAX_BRACKETS:
        raise TokenError("not a small JSON object")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise TokenError("not JSON") from None
    if not isinstance(value, dict):
        raise TokenError("not a JSON object")
    return value


def load_secret(config: Config) -> str:
    """Return the configured secret, or the kept one, generating and keeping it on first start."""
    configured = config.get("auth", "jwt_secret")
    if configured:
        return configured
    path = config.resolve_path(config.get("auth", "secret_file"))
    try:
        return read_secret_file("auth.secret_file", path, min_bytes=32)
    except SecretFileMissing:
        pass
    secret = secrets.token_urlsafe(48)
    try:
        # O_EXCL: two processes starting at once must not each write a different secret.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return load_secret(config)
    except OSError as exc:
        raise ConfigError(f"auth.secret_file: cannot create {path} ({exc.strerror})") from None
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(secret + "\n")
    logger.info("generated a new token signing secret in %s", path)
    return secret
