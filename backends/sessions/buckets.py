"""Rate buckets shared by every worker and server on one session store (homeserver.ratelimit)."""

from __future__ import annotations

import abc


class RateBuckets(abc.ABC):
    """Token buckets kept in the store, so every process on it shares one burst per key
    (the login limits with `[rate_limit] shared = true`). Each step is atomic and on the
    store's clock (the host's for SQLite, Redis `TIME`), so processes whose clocks differ
    agree. Raises `backends.base.StoreUnavailable` when the store cannot answer (the limits
    then count in each process until it answers again).
    """

    @abc.abstractmethod
    async def rate_limit(self, key: str, interval: float, capacity: float, *, take: bool = True) -> float:
        """One GCRA step, as homeserver.ratelimit.TokenBuckets.

        `interval` = 1/rate seconds, `capacity` = burst * interval. With `take`: 0.0 and a
        token taken, or the seconds to wait and nothing taken. Without (a peek): only the
        wait, and nothing written.
        """
