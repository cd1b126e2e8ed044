"""The SQLite session store (the default): one WAL file shared by every worker process on a host,
one module per concern (see backends/sessions/__init__.py)."""

from backends.sessions.sqlite.store import SqliteSessionStore

__all__ = ["SqliteSessionStore"]
