"""The session store: one store (`[sessions] store`, SQLite or Redis) keeping sessions and a few
other parts, each behind a small interface of its own, reached through the store by one door
each (as MAS's `RepositoryAccess`: `repo.browser_session()`, `repo.oauth2_session()`).

    store = create_session_store(kind, options, config_dir=...)   # the one registry below
    store.open(session, name), store.get(user, digest), ...       # sessions and devices
    store.oauth()             -> OAuthStore       OAuth clients, codes, grants, device codes
    store.browser_sessions()  -> BrowserSessions  the account page's sign-ins
    store.buckets()           -> RateBuckets      login rate-limit buckets every process shares
    store.delegation()        -> DelegationState  what Synapse was told (`[delegation]`)
    store.login_tokens()      -> LoginTokenStore  legacy clients' login tokens (MSC3824)
    store.imported()          -> ImportedState    a Synapse moved here: its tokens, its deactivated users
    store.factors()           -> FactorStore      second factors and WebAuthn challenges (`[mfa]`)

A door returns the same object every time, built with the store on its own connection; a
caller takes the part it needs and never tests the store's class.

Interfaces, one module each, here:

- base.py: `SessionStore`, sessions and devices, the store's life (from_config, start,
  close, check_health) and the doors; records.py: the `Session` and `Device` records;
- oauth.py: `OAuthStore` (and `Grant`, `DeviceAuthorization`); browser.py: `BrowserSessions`
  (and `BrowserSession`); buckets.py: `RateBuckets`; delegation.py: `DelegationState`;
  login_tokens.py: `LoginTokenStore` (and `LoginTokenRecord`);
  imported.py: `ImportedState` (and `ImportBatch`);
- factors.py: `FactorStore`, the second factors (issue 38), and its records `Factor`, `Challenge`.

Implementations, one folder per store, one file per concern:

- sqlite/: store.py (`SqliteSessionStore`: sessions, devices, the doors), file.py
  (`SqliteFile`, the session file: its writer thread and transactions, the loop's read
  connection, the purge; `SqlitePart`, what every part stands on), changes.py (the change
  counter processes share), schema.py (the tables, in numbered migrations), then one file per
  part: oauth.py with oauth_device.py, browser.py, buckets.py, delegation.py, login_tokens.py,
  imported.py, factors.py;
- redis/: store.py (`RedisSessionStore`), part.py (`RedisPart`: the connection, the key
  prefix, `script`; `user_base`, the hash tag of a user's keys), scripts.py (the sessions'
  Lua scripts), then one file per part, as SQLite's (each with its own scripts and keys).

A new part (this round's: imported Synapse tokens, second factors, the directory sweep's
state): its interface in a module here (say `second_factors.py`, an ABC whose methods raise
`backends.base.StoreUnavailable` when the store cannot answer);
one file per store implementing it on the store's plumbing (`sqlite/second_factors.py`, a
`SqlitePart` whose tables come in a new numbered migration in sqlite/schema.py;
`redis/second_factors.py`, a `RedisPart` whose keys its docstring and docs/redis.md list);
one door on `SessionStore` (`def second_factors(self) -> SecondFactors`, abstract in base.py),
built in each store's `__init__` and returned by its door; and a contract test run against
both stores (tests/backends/test_session_store.py's `each_session_store`).

A new store: a folder beside sqlite/ and redis/ implementing `SessionStore` and every part,
its keys under `sessions.<name>` in homeserver/config_schema.py, and one line in `_STORES`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from backends.base import ConfigError
from backends.sessions.base import SessionStore
from backends.sessions.browser import BrowserSessions
from backends.sessions.buckets import RateBuckets
from backends.sessions.delegation import DelegationState
from backends.sessions.factors import FactorStore
from backends.sessions.imported import ImportBatch, ImportedState
from backends.sessions.login_tokens import LoginTokenRecord, LoginTokenStore
from backends.sessions.oauth import OAuthStore
from backends.sessions.records import Device, Session

__all__ = [
    "BrowserSessions",
    "DelegationState",
    "Device",
    "FactorStore",
    "ImportBatch",
    "ImportedState",
    "LoginTokenRecord",
    "LoginTokenStore",
    "OAuthStore",
    "RateBuckets",
    "Session",
    "SessionStore",
    "create_session_store",
]


def _sqlite() -> type[SessionStore]:
    from backends.sessions.sqlite import SqliteSessionStore

    return SqliteSessionStore


def _redis() -> type[SessionStore]:
    # Imported only when chosen: the Redis client costs ~0.1 s at every start otherwise.
    from backends.sessions.redis import RedisSessionStore

    return RedisSessionStore


# The store kinds `[sessions] store` may name, each imported when chosen.
_STORES: dict[str, Callable[[], type[SessionStore]]] = {"sqlite": _sqlite, "redis": _redis}


def create_session_store(kind: str, options: dict[str, Any], *, config_dir: str) -> SessionStore:
    """Build (not start) the configured session store from its section's options."""
    load = _STORES.get(kind)
    if load is None:
        raise ConfigError(f"sessions.store: unknown store {kind!r} (known: {', '.join(sorted(_STORES))})")
    return load().from_config(options, config_dir=config_dir)
