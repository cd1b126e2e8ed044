"""The Redis session store: sessions shared by every server on one Redis (standalone, Sentinel,
Cluster), one module per concern (see backends/sessions/__init__.py)."""

from backends.sessions.redis.store import RedisSessionStore

__all__ = ["RedisSessionStore"]
