"""Session store registry: `[sessions] store` names a store class, imported only when used."""

from __future__ import annotations

import importlib
from typing import Any

from backends.base import ConfigError
from backends.sessions.base import Device, Session, SessionStore

__all__ = ["Device", "Session", "SessionStore", "create_session_store"]

_registry: dict[str, type[SessionStore] | str] = {
    "sqlite": "backends.sessions.sqlite:SqliteSessionStore",
    "redis": "backends.sessions.redis:RedisSessionStore",
}


def create_session_store(kind: str, options: dict[str, Any], *, config_dir: str) -> SessionStore:
    """Build the configured session store from its section's options."""
    try:
        entry = _registry[kind]
    except KeyError:
        raise ConfigError(f"sessions.store: unknown store {kind!r} (known: {', '.join(sorted(_registry))})") from None
    if isinstance(entry, str):
        module_name, _, class_name = entry.partition(":")
        entry = getattr(importlib.import_module(module_name), class_name)
        _registry[kind] = entry
    return entry.from_config(options, config_dir=config_dir)
