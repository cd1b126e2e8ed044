"""`[delegation]`: checked once at start-up, so a bad value stops the server with one line."""

from __future__ import annotations

from dataclasses import dataclass

from backends.secret_file import read_secret_file
from homeserver.config import Config
from homeserver.errors import ConfigError

MIN_SECRET_BYTES = 32
# Synapse reads the secret from `Authorization: Bearer <secret>`, split at spaces and decoded
# as ASCII; and an HTTP header carries no more than Latin-1 (a secret past it failed every
# call with the header line in the error, the secret in the log).
SECRET_CHARACTERS = "only visible ASCII characters, no spaces (Synapse reads it from an HTTP header)"


def readable_by_synapse(secret: str) -> bool:
    return secret.isascii() and secret.isprintable() and " " not in secret


@dataclass(frozen=True)
class DelegationSettings:
    """What the delegation needs of the config, checked."""

    synapse_url: str  # no trailing slash
    secret: str
    admins: frozenset[str]
    timeout: float
    retry_interval: float
    sync_interval: float = 0.0  # seconds between sweeps of the user store; 0: none
    deactivate_after: float = 86400.0  # seconds missing from the store before a deactivation


def load_delegation_settings(config: Config) -> DelegationSettings | None:
    """The checked `[delegation]` section; None when delegation is off. ConfigError (one line) else."""
    section = config.section("delegation")
    if not section["enabled"]:
        return None
    url = section["synapse_url"].rstrip("/")
    if not url:
        raise ConfigError("delegation.synapse_url: needed when delegation.enabled is true (Synapse's client listener)")
    secret, secret_file = section["secret"], section["secret_file"]
    if secret and secret_file:
        raise ConfigError("delegation.secret and delegation.secret_file: give one of them, not both")
    if secret_file:
        path = config.resolve_path(secret_file)
        secret = read_secret_file("delegation.secret_file", path, min_bytes=MIN_SECRET_BYTES)
        if not readable_by_synapse(secret):
            raise ConfigError(f"delegation.secret_file: {path}: {SECRET_CHARACTERS}")
    elif not secret:
        raise ConfigError("delegation.secret: needed when delegation.enabled is true (or delegation.secret_file)")
    elif len(secret.encode("utf-8")) < MIN_SECRET_BYTES:
        raise ConfigError(f"delegation.secret: must be at least {MIN_SECRET_BYTES} bytes")
    elif not readable_by_synapse(secret):
        raise ConfigError(f"delegation.secret: {SECRET_CHARACTERS}")
    return DelegationSettings(
        synapse_url=url,
        secret=secret,
        admins=frozenset(section["admins"]),
        timeout=section["timeout"],
        retry_interval=section["retry_interval"],
        sync_interval=section["sync_interval"],
        deactivate_after=section["deactivate_after"],
    )
