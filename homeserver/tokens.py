"""HS256 access tokens (compact JWS via python-jose) and the server-held signing secret."""

from __future__ import annotations

import logging
import os
import secrets
import time
from dataclasses import dataclass

from jose import jwt
from jose.exceptions import JOSEError

from homeserver.config import Config
from homeserver.errors import ConfigError

logger = logging.getLogger(__name__)

# Always a list: python-jose treats a string as a substring allow-list ("HS2" passes).
ALGORITHMS = ["HS256"]


class TokenError(Exception):
    """The token is malformed, tampered, signed otherwise, or expired."""


@dataclass(frozen=True, slots=True)
class Claims:
    name: str
    device_id: str


class TokenIssuer:
    """Signs and verifies access tokens with one secret."""

    def __init__(self, secret: str, lifetime: int = 0) -> None:
        self.secret = secret
        self.lifetime = lifetime

    def issue(self, name: str, device_id: str) -> str:
        """Sign the claims `sub` and `device_id` (plus `exp` when a lifetime is set)."""
        claims: dict[str, object] = {"sub": name, "device_id": device_id}
        if self.lifetime:
            claims["exp"] = int(time.time()) + self.lifetime
        return jwt.encode(claims, self.secret, algorithm=ALGORITHMS[0])

    def verify(self, token: str) -> Claims:
        """Return the claims of a valid token; TokenError for anything else."""
        try:
            claims = jwt.decode(token, self.secret, algorithms=ALGORITHMS)
        except (JOSEError, UnicodeError) as exc:  # UnicodeError: text that is no token at all
            raise TokenError(str(exc)) from None
        name, device_id = claims.get("sub"), claims.get("device_id")
        if not isinstance(name, str) or not isinstance(device_id, str):
            raise TokenError("token lacks sub or device_id")
        return Claims(name, device_id)


def load_secret(config: Config) -> str:
    """Return the configured secret, or the kept one, generating and keeping it on first start."""
    configured = config.get("auth", "jwt_secret")
    if configured:
        return configured
    path = config.resolve_path(config.get("auth", "secret_file"))
    try:
        with open(path, encoding="utf-8") as fh:
            secret = fh.read().strip()
    except FileNotFoundError:
        secret = ""
    except OSError as exc:
        raise ConfigError(f"auth.secret_file: {path} cannot be read ({exc.strerror})") from None
    else:
        if len(secret.encode("utf-8")) < 32:
            raise ConfigError(f"auth.secret_file: {path} holds fewer than 32 bytes")
        return secret
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
