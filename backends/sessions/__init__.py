"""The session store: one store (`[sessions] store`, SQLite or Redis) doing a few jobs, each
behind a small interface of its own, so a part of the server takes only the one it needs.

Interfaces (what each is for, and where it lives):

- `SessionStore` (base.py): sessions and devices, and the store's life (from_config,
  start, close, check_health). The main one: the registry below builds it.
- `DelegationState` (delegation.py): what Synapse was told, when this server is its
  authentication service: provisioned profiles, devices to tell it again.
- `RateBuckets` (buckets.py): login rate-limit buckets shared by every process on the store.
- Page sessions of the account page: pages.py. OAuth clients, authorization codes and
  refresh tokens: oauth.py. Each interface goes in a module of its own, named for its job.

Implementations: one class per store implements several interfaces, so they share one
connection (`SqliteSessionStore`, `RedisSessionStore`). Each interface's part is a class of
its own, beside its siblings (sqlite_delegation.py, sqlite_buckets.py; redis_delegation.py,
redis_buckets.py), built on the store's plumbing, which any other interface can use too:

- SQLite: `SqliteFile` (sqlite_file.py), the session file: its writer thread and write
  connection (`write`, `transaction`), the loop's read connection (`read`), the change
  counter (sqlite_changes.py), the schema and its migrations (sqlite_schema.py);
- Redis: `RedisPart` (redis_part.py): the connection, the key prefix, `script` (Lua,
  redis_scripts.py).

`buckets_of(store)`, `delegation_state_of(store)` give the store seen as one of its other
interfaces (a clear ConfigError when the configured store lacks it); a new interface adds
its own such function.
"""

from __future__ import annotations

import importlib
from typing import Any

from backends.base import ConfigError
from backends.sessions.base import SessionStore
from backends.sessions.buckets import RateBuckets
from backends.sessions.delegation import DelegationState
from backends.sessions.records import Device, Session

__all__ = [
    "DelegationState",
    "Device",
    "RateBuckets",
    "Session",
    "SessionStore",
    "buckets_of",
    "create_session_store",
    "delegation_state_of",
]

_registry: dict[str, type[SessionStore] | str] = {
    "sqlite": "backends.sessions.sqlite.store:SqliteSessionStore",
    "redis": "backends.sessions.redis.store:RedisSessionStore",
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


def _as(store: SessionStore, interface: Any) -> Any:
    if not isinstance(store, interface):
        raise ConfigError(f"sessions.store: the {store.name or type(store).__name__} store does not keep "
                          f"{interface.__name__}")
    return store


def buckets_of(store: SessionStore) -> RateBuckets:
    """The session store seen as its RateBuckets (the same object)."""
    result: RateBuckets = _as(store, RateBuckets)
    return result


def delegation_state_of(store: SessionStore) -> DelegationState:
    """The session store seen as its DelegationState (the same object)."""
    result: DelegationState = _as(store, DelegationState)
    return result
