"""The OAuth store (backends.sessions.oauth) that goes with a session store: on the same SQLite
file or the same Redis."""

from __future__ import annotations

from backends.sessions.base import SessionStore
from backends.sessions.oauth import OAuthStore
from backends.sessions.sqlite.oauth import SqliteOAuthStore
from backends.sessions.sqlite.store import SqliteSessionStore


def create_oauth_store(sessions: SessionStore) -> OAuthStore:
    """The OAuth store on the session store's own connection."""
    # The one place that knows the session stores' plumbing: the writer thread and its
    # connection of the SQLite file, the connection and key layout of the Redis.
    if isinstance(sessions, SqliteSessionStore):
        return SqliteOAuthStore(sessions)
    # Imported only for Redis sessions: the Redis client costs ~0.1 s at every start otherwise.
    from backends.sessions.redis.store import RedisSessionStore

    if isinstance(sessions, RedisSessionStore):
        from backends.sessions.redis.oauth import RedisOAuthStore

        return RedisOAuthStore(sessions)
    raise ValueError(f"no OAuth store for the session store {sessions.name!r}")
