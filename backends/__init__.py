"""Backend registry: `[backend] type` names a backend class, imported only when used."""

from __future__ import annotations

import importlib
from typing import Any

from backends.base import ConfigError, User, UserBackend, UserExists

__all__ = ["ConfigError", "User", "UserBackend", "UserExists", "create_backend", "known", "register"]

# Built-in backends as "module:Class", so Redis and LDAP clients load only when chosen.
_registry: dict[str, type[UserBackend] | str] = {
    "file": "backends.file:FileBackend",
    "redis": "backends.redis:RedisBackend",
    "ldap": "backends.ldap:LdapBackend",
}


def register(name: str, cls: type[UserBackend] | str) -> None:
    """Make a backend class available as `[backend] type = name`."""
    _registry[name] = cls


def known() -> list[str]:
    return sorted(_registry)


def resolve(name: str) -> type[UserBackend]:
    """Return the backend class registered as `name`; ConfigError when there is none."""
    try:
        entry = _registry[name]
    except KeyError:
        raise ConfigError(
            f"backend.type: unknown backend {name!r} (known: {', '.join(known())})"
        ) from None
    if isinstance(entry, str):
        module_name, _, class_name = entry.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ConfigError(f"backend.type: backend {name!r} cannot be loaded: {exc}") from exc
        entry = getattr(module, class_name)
        _registry[name] = entry
    return entry


def create_backend(name: str, options: dict[str, Any], *, config_dir: str) -> UserBackend:
    """Build the configured backend from its section's options."""
    return resolve(name).from_config(options, config_dir=config_dir)
