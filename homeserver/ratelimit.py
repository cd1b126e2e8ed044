"""Login rate limits: per-key token buckets (Synapse's rc_login) with an injectable clock."""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable, Mapping

from homeserver.errors import MatrixError

logger = logging.getLogger(__name__)

Clock = Callable[[], float]

# How many idle buckets one call may evict from the front; keeps the cost per call O(1)
# while the table still drains as fast as it fills.
_EVICT_PER_CALL = 2


class TokenBuckets:
    """One token bucket per key: `burst` tokens, refilled at `rate` tokens per second.

    Each bucket is stored as a single float, the time at which it will be full again
    (the GCRA form of a token bucket). A bucket that is full again holds no information,
    so it is dropped; keys are kept in least-recently-used order, so idle buckets sit at
    the front and are evicted a few at a time on every call. At most `max_keys` buckets
    are kept: past that the least recently used is dropped even if not yet full, which
    forgives that key rather than letting a flood of addresses grow memory without bound.
    """

    def __init__(self, rate: float, burst: float, *, clock: Clock = time.monotonic, max_keys: int = 100_000) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be positive and burst at least 1")
        self.interval = 1.0 / rate  # seconds one token takes to come back
        self.capacity = burst * self.interval  # seconds of debt a full burst represents
        self.clock = clock
        self.max_keys = max_keys
        self._full_at: dict[str, float] = {}
        self._warned_full = False

    def __len__(self) -> int:
        return len(self._full_at)

    def _evict(self, now: float) -> None:
        table = self._full_at
        for _ in range(_EVICT_PER_CALL):
            if not table:
                return
            key = next(iter(table))
            if table[key] > now:
                return
            del table[key]

    def wait_time(self, key: str) -> float:
        """Return 0.0 when `key` may act now, else the seconds until it may; take no token."""
        now = self.clock()
        full_at = self._full_at.get(key, now)
        excess = max(full_at, now) + self.interval - now - self.capacity
        return excess if excess > 1e-9 else 0.0

    def take(self, key: str) -> float:
        """Take a token for `key`: 0.0 when allowed, else the seconds to wait (nothing taken)."""
        now = self.clock()
        table = self._full_at
        self._evict(now)
        full_at = table.pop(key, now)
        new_full_at = max(full_at, now) + self.interval
        excess = new_full_at - now - self.capacity
        if excess > 1e-9:
            if full_at > now:
                table[key] = full_at  # re-insert at the back: recently used
            return excess
        table[key] = new_full_at
        if len(table) > self.max_keys:
            del table[next(iter(table))]
            if not self._warned_full:
                self._warned_full = True
                logger.warning("rate limit table full (%d keys); forgetting the least recently used", self.max_keys)
        return 0.0


def limit_exceeded(seconds: float) -> MatrixError:
    """The 429 answer, with the wait both in the body and as a Retry-After header."""
    ms = max(1, math.ceil(seconds * 1000))
    return MatrixError(
        429,
        "M_LIMIT_EXCEEDED",
        "Too many requests",
        headers={"Retry-After": str(max(1, math.ceil(seconds)))},
        retry_after_ms=ms,
    )


class LoginLimits:
    """The three login limits: per client address, per account, per account's failures.

    A limit set to None is off; `LoginLimits()` has all three off.
    """

    def __init__(
        self,
        address: TokenBuckets | None = None,
        account: TokenBuckets | None = None,
        failures: TokenBuckets | None = None,
    ) -> None:
        self.address = address
        self.account = account
        self.failures = failures

    @classmethod
    def from_config(cls, section: Mapping[str, Any], clock: Clock = time.monotonic) -> "LoginLimits":
        """Build from the validated `[rate_limit]` section; all off when `enabled = false`."""
        if not section["enabled"]:
            return cls()

        def buckets(prefix: str) -> TokenBuckets:
            return TokenBuckets(
                section[f"{prefix}_per_second"],
                section[f"{prefix}_burst"],
                clock=clock,
                max_keys=section["max_entries"],
            )

        return cls(buckets("address"), buckets("account"), buckets("failed_attempts"))

    @staticmethod
    def account_key(name: str) -> str:
        # Case variants of a name reach the same account (case-insensitive lookup), so
        # they share one bucket; otherwise "ALICE", "Alice"... would each get a burst.
        return name.casefold()

    def check_address(self, address: str) -> None:
        """Count a login attempt from `address`; 429 when over the limit."""
        if self.address is not None:
            wait = self.address.take(address)
            if wait:
                raise limit_exceeded(wait)

    def check_account(self, name: str) -> None:
        """Count an attempt on account `name`, and refuse one whose failures are over the limit."""
        self.check_failures(name)
        if self.account is not None:
            wait = self.account.take(self.account_key(name))
            if wait:
                raise limit_exceeded(wait)

    def check_failures(self, name: str) -> None:
        """Refuse (429) an account whose failed attempts are over the limit; take nothing."""
        if self.failures is not None:
            wait = self.failures.wait_time(self.account_key(name))
            if wait:
                raise limit_exceeded(wait)

    def record_failure(self, name: str) -> None:
        """Count a failed attempt (unknown user or wrong password) on account `name`."""
        if self.failures is not None:
            self.failures.take(self.account_key(name))
