"""`[delegation]`: checked once at start-up, so a bad value stops the server with one line."""

from __future__ import annotations

from dataclasses import dataclass

from homeserver.config import Config
from homeserver.errors import ConfigError

MIN_SECRET_BYTES = 32


@dataclass(frozen=True)
class DelegationSettings:
    """What the delegation needs of the config, checked."""

    synapse_url: str  # no trailing slash
    secret: str
    admins: frozenset[str]
    timeout: float
    retry_interval: float


def _secret_from_file(config: Config, value: str) -> str:
    path = config.resolve_path(value)
    try:
        with open(path, encoding="utf-8") as fh:
            secret = fh.read().strip()
    except OSError as exc:
        raise ConfigError(f"delegation.secret_file: {path} cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"delegation.secret_file: {path} is not UTF-8 text") from None
    if len(secret.encode("utf-8")) < MIN_SECRET_BYTES:
        raise ConfigError(f"delegation.secret_file: {path} holds fewer than {MIN_SECRET_BYTES} bytes")
    return secret


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
        secret = _secret_from_file(config, secret_file)
    elif not secret:
        raise ConfigError("delegation.secret: needed when delegation.enabled is true (or delegation.secret_file)")
    elif len(secret.encode("utf-8")) < MIN_SECRET_BYTES:
        raise ConfigError(f"delegation.secret: must be at least {MIN_SECRET_BYTES} bytes")
    return DelegationSettings(
        synapse_url=url,
        secret=secret,
        admins=frozenset(section["admins"]),
        timeout=section["timeout"],
        retry_interval=section["retry_interval"],
    )
