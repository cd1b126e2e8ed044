"""The per-person limit on wrong codes: in the shared rate buckets when they answer, in the
process while they do not; a person over it is refused, the right code too."""

from __future__ import annotations

import asyncio
import logging

import pytest

from backends.base import StoreUnavailable
from backends.sessions.buckets import RateBuckets
from homeserver.config import build_config
from homeserver.mfa.limits import TooManyWrongCodes, WrongCodeLimit
from homeserver.ratelimit import TokenBuckets


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class SharedBuckets(RateBuckets):
    """RateBuckets as the stores keep them (one GCRA time per key), in a dict, with the keys
    seen; `down` makes every step fail as a store that cannot answer."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.full_at: dict[str, float] = {}
        self.down = False

    async def rate_limit(self, key: str, interval: float, capacity: float, *, take: bool = True) -> float:
        if self.down:
            raise StoreUnavailable("down", store="session store")
        now = self.clock()
        new = max(self.full_at.get(key, now), now) + interval
        excess = new - now - capacity
        if excess > 1e-9:
            return excess
        if take:
            self.full_at[key] = new
        return 0.0


@pytest.fixture
def clock():
    return Clock()


async def over_the_burst(limit: WrongCodeLimit, user: str, burst: int) -> None:
    for _ in range(burst):
        await limit.check(user)
        await limit.failed(user)


async def test_a_burst_of_wrong_codes_then_one_a_while(clock):
    shared = SharedBuckets(clock)
    limit = WrongCodeLimit(0.1, 3, shared, clock=clock)
    await over_the_burst(limit, "alice", 3)
    with pytest.raises(TooManyWrongCodes) as caught:
        await limit.check("alice")
    assert 9 < caught.value.retry_after <= 10
    await limit.check("bob")  # each person has their own
    with pytest.raises(TooManyWrongCodes):
        await limit.check("ALICE")  # case variants are one person
    clock.now += 10
    await limit.check("alice")


async def test_the_count_is_in_the_shared_buckets_under_its_own_key(clock):
    shared = SharedBuckets(clock)
    one, other = WrongCodeLimit(0.1, 3, shared, clock=clock), WrongCodeLimit(0.1, 3, shared, clock=clock)
    await one.failed("Alice")
    await other.failed("alice")
    await one.failed("alice")
    assert list(shared.full_at) == ["mfa-failed:alice"]  # case variants are one person
    with pytest.raises(TooManyWrongCodes):
        await other.check("alice")  # another process sees the first's count


async def test_without_the_store_each_process_counts_and_says_so_once(clock, caplog):
    shared = SharedBuckets(clock)
    shared.down = True
    limit = WrongCodeLimit(0.1, 2, shared, clock=clock, retry_shared=5)
    with caplog.at_level(logging.WARNING):
        await over_the_burst(limit, "alice", 2)
        with pytest.raises(TooManyWrongCodes):
            await limit.check("alice")
    assert caplog.text.count("shared second-factor limits unavailable") == 1
    shared.down = False
    clock.now += 5
    with caplog.at_level(logging.WARNING):
        await limit.check("alice")  # the store again: it has seen nothing of alice
    assert "answer again" in caplog.text


async def test_without_shared_buckets_it_counts_in_the_process(clock):
    limit = WrongCodeLimit(0.1, 1, None, clock=clock)
    await over_the_burst(limit, "alice", 1)
    with pytest.raises(TooManyWrongCodes):
        await limit.check("alice")


def test_from_config():
    section = build_config({"mfa": {"failed_codes_per_second": 0.5, "failed_codes_burst": 2}}, environ={}).section("mfa")
    limit = WrongCodeLimit.from_config(section, None)
    assert isinstance(limit.local, TokenBuckets)
    assert (limit.local.interval, limit.local.capacity) == (2.0, 4.0)


async def test_one_persons_codes_are_checked_one_at_a_time_and_nothing_is_kept_after(clock):
    limit = WrongCodeLimit(0.1, 3, None, clock=clock)
    order: list[str] = []

    async def check(user: str, tag: str) -> None:
        async with limit.one_at_a_time(user):
            order.append(f"{tag} in")
            await asyncio.sleep(0)
            order.append(f"{tag} out")

    await asyncio.gather(check("alice", "a1"), check("ALICE", "a2"), check("bob", "b"))
    assert order.index("a1 out") < order.index("a2 in")  # case variants are one person
    assert order.index("b in") < order.index("a1 out")  # another person does not wait
    assert limit._turns == {}
