"""The backend tests' fixtures: private redis-server, Sentinel, Cluster and slapd processes."""

from tests.support.redis_servers import (
    redis_cluster,
    redis_server,
    redis_url,
    redis_users,
    sentinel_setup,
)
from tests.support.slapd import slapd

# Re-exported so pytest finds them for every module in this folder.
__all__ = ["redis_cluster", "redis_server", "redis_url", "redis_users", "sentinel_setup", "slapd"]
