"""The per-person limit on wrong second-factor codes, in the session store's shared rate
buckets (backends.sessions.buckets.RateBuckets, as `[rate_limit] shared` login limits), so
every worker and every server on one store counts one person's guesses together.

A person over the limit has every code refused, the right one too, until the bucket fills
again: otherwise the limit would still answer, for each guess, whether it was right. A
six-digit code matches one in a million; three codes pass at a time (the window), so with
the defaults (a burst of 5, then one a minute) a day of guessing passes with odds of about
0.4 %, and every guess is in the audit log. Passkeys are not limited by it: an assertion
cannot be guessed, and a person whose codes are being guessed can still sign in with one.

The limit is read before a code is looked at and a wrong one counted after, so one person's
codes are checked one at a time in a process (`one_at_a_time`): guesses sent together would
otherwise all be read under the limit before the first was counted. Several processes on one
store each let one through at a time: at most that many past the limit, not a flood.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from backends.sessions.buckets import RateBuckets
from homeserver.errors import StoreUnavailable
from homeserver.ratelimit import Clock, TokenBuckets, store_key

logger = logging.getLogger(__name__)

BUCKET_KIND = "mfa-failed"


class TooManyWrongCodes(Exception):
    """Refused: the person's wrong codes are over the limit; try again in `retry_after` s."""

    def __init__(self, retry_after: float) -> None:
        super().__init__("too many wrong second-factor codes")
        self.retry_after = retry_after


class WrongCodeLimit:
    """A token bucket per person: `burst` wrong codes, then `per_second`.

    With `shared` buckets it counts in the store; while the store cannot answer, in this
    process (logged once an outage, as homeserver.ratelimit.LoginLimits does), trying the
    store again after `retry_shared` seconds.
    """

    def __init__(
        self,
        per_second: float,
        burst: int,
        shared: RateBuckets | None = None,
        *,
        retry_shared: float = 5.0,
        clock: Clock = time.monotonic,
    ) -> None:
        self.local = TokenBuckets(per_second, burst, clock=clock)
        self.shared = shared
        self.retry_shared = retry_shared
        self.clock = clock
        self._local_until = 0.0
        self._degraded = False
        # The person whose code is being checked in this process, and how many wait for it.
        self._turns: dict[str, tuple[asyncio.Lock, int]] = {}

    @staticmethod
    def key(user: str) -> str:
        return store_key(BUCKET_KIND, user.casefold())

    async def _step(self, user: str, take: bool) -> float:
        if self.shared is not None and self.clock() >= self._local_until:
            try:
                wait = await self.shared.rate_limit(
                    self.key(user), self.local.interval, self.local.capacity, take=take
                )
            except StoreUnavailable as exc:
                if not self._degraded:
                    self._degraded = True
                    logger.warning("shared second-factor limits unavailable, each process counts on its own: %s", exc)
                self._local_until = self.clock() + self.retry_shared
            else:
                if self._degraded:
                    self._degraded = False
                    logger.warning("shared second-factor limits answer again")
                return wait
        key = user.casefold()
        return self.local.take(key) if take else self.local.wait_time(key)

    @asynccontextmanager
    async def one_at_a_time(self, user: str) -> AsyncIterator[None]:
        """Hold the person's other codes in this process until this one is checked and counted."""
        key = user.casefold()
        lock, waiting = self._turns.get(key, (asyncio.Lock(), 0))
        self._turns[key] = (lock, waiting + 1)
        try:
            async with lock:
                yield
        finally:
            lock, waiting = self._turns[key]
            if waiting == 1:
                del self._turns[key]
            else:
                self._turns[key] = (lock, waiting - 1)

    async def check(self, user: str) -> None:
        """Refuse (TooManyWrongCodes) a person whose wrong codes are over the limit; take nothing."""
        wait = await self._step(user, take=False)
        if wait:
            raise TooManyWrongCodes(wait)

    async def failed(self, user: str) -> None:
        """Count one wrong code of the person."""
        await self._step(user, take=True)

    @classmethod
    def from_config(cls, section: dict[str, object], shared: RateBuckets | None) -> WrongCodeLimit:
        """From the validated `[mfa]` section and the session store's buckets."""
        per_second = section["failed_codes_per_second"]
        burst = section["failed_codes_burst"]
        assert isinstance(per_second, float) and isinstance(burst, int)
        return cls(per_second, burst, shared)
