"""Login rate limits: per-key token buckets (Synapse's rc_login) with an injectable clock."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from backends.sessions.buckets import RateBuckets
from homeserver.errors import StoreUnavailable, limit_exceeded

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


def store_key(kind: str, key: str) -> str:
    """A bucket's key in the shared store: always UTF-8 text, never long.

    Names are client input: lone surrogates are escaped, and a name too long to be any
    account's (over 255 bytes) is replaced by its digest, so no key grows with the body.
    """
    text = key.encode("utf-8", "backslashreplace")
    if len(text) > 255:
        return f"{kind}:#{hashlib.sha256(text).hexdigest()}"
    return f"{kind}:{text.decode('utf-8')}"


class LoginLimits:
    """The three login limits: per client address, per account, per account's failures.

    A limit set to None is off; `LoginLimits()` has all three off. With `shared` buckets
    (the session store's RateBuckets, backends.sessions.buckets) the buckets live there, so
    every worker and every server on that store shares one burst; while the store cannot
    answer, each process falls back to its own buckets (logged once, counted in
    `fallbacks`) and tries the store again after
    `retry_shared` seconds.
    """

    def __init__(
        self,
        address: TokenBuckets | None = None,
        account: TokenBuckets | None = None,
        failures: TokenBuckets | None = None,
        *,
        shared: RateBuckets | None = None,
        retry_shared: float = 5.0,
        clock: Clock = time.monotonic,
        on_fallback: Callable[[], None] | None = None,
    ) -> None:
        self.address = address
        self.account = account
        self.failures = failures
        self.shared = shared
        self.retry_shared = retry_shared
        self.clock = clock
        self.fallbacks = 0  # times the shared store failed and local buckets answered
        self._local_until = 0.0  # while the clock is below it, use the local buckets
        self._degraded = False
        self.on_fallback = on_fallback  # told of each fall-back (the metrics count them)

    @classmethod
    def from_config(
        cls,
        section: Mapping[str, Any],
        clock: Clock = time.monotonic,
        shared: RateBuckets | None = None,
        on_fallback: Callable[[], None] | None = None,
    ) -> LoginLimits:
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

        return cls(
            buckets("address"),
            buckets("account"),
            buckets("failed_attempts"),
            shared=shared if section["shared"] else None,
            clock=clock,
            on_fallback=on_fallback,
        )

    @staticmethod
    def account_key(name: str) -> str:
        # Case variants of a name reach the same account (case-insensitive lookup), so
        # they share one bucket; otherwise "ALICE", "Alice"... would each get a burst.
        return name.casefold()

    async def _step(self, kind: str, buckets: TokenBuckets, key: str, take: bool = True) -> float:
        """One bucket step: in the shared store when it answers, else in this process."""
        if self.shared is not None and self.clock() >= self._local_until:
            try:
                wait = await self.shared.rate_limit(store_key(kind, key), buckets.interval, buckets.capacity, take=take)
            except StoreUnavailable as exc:
                self._fall_back(exc)
            else:
                if self._degraded:
                    self._degraded = False
                    logger.warning("shared rate limits answer again")
                return wait
        return buckets.take(key) if take else buckets.wait_time(key)

    def _fall_back(self, exc: StoreUnavailable) -> None:
        if not self._degraded:  # logged once per outage
            self._degraded = True
            logger.warning("shared rate limits unavailable, each process counts on its own until they answer: %s", exc)
        self.fallbacks += 1
        self._local_until = self.clock() + self.retry_shared
        if self.on_fallback is not None:
            self.on_fallback()

    async def check_address(self, address: str) -> None:
        """Count a login attempt from `address`; 429 when over the limit."""
        if self.address is not None:
            wait = await self._step("address", self.address, address)
            if wait:
                raise limit_exceeded(wait)

    async def check_account(self, name: str) -> None:
        """Count an attempt on account `name`, and refuse one whose failures are over the limit."""
        await self.check_failures(name)
        if self.account is not None:
            wait = await self._step("account", self.account, self.account_key(name))
            if wait:
                raise limit_exceeded(wait)

    async def check_failures(self, name: str) -> None:
        """Refuse (429) an account whose failed attempts are over the limit; take nothing."""
        if self.failures is not None:
            wait = await self._step("failed", self.failures, self.account_key(name), take=False)
            if wait:
                raise limit_exceeded(wait)

    async def record_failure(self, name: str) -> None:
        """Count a failed attempt (unknown user or wrong password) on account `name`."""
        if self.failures is not None:
            await self._step("failed", self.failures, self.account_key(name))
