"""Token buckets with a controllable clock, and the login limits over HTTP."""

from __future__ import annotations

import pytest

from homeserver.config import build_config
from homeserver.errors import limit_exceeded
from homeserver.ratelimit import LoginLimits, TokenBuckets
from tests.support.helpers import assert_error, assert_json


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_burst_then_refused_then_refilled(clock):
    buckets = TokenBuckets(rate=0.5, burst=3, clock=clock)
    assert [buckets.take("k") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take("k") == pytest.approx(2.0)  # one token comes back every 2 s
    clock.advance(1.0)
    assert buckets.take("k") == pytest.approx(1.0)  # a refused attempt costs nothing
    clock.advance(1.0)
    assert buckets.take("k") == 0.0
    assert buckets.take("k") == pytest.approx(2.0)


def test_keys_are_independent(clock):
    buckets = TokenBuckets(rate=1, burst=1, clock=clock)
    assert buckets.take("a") == 0.0
    assert buckets.take("a") > 0
    assert buckets.take("b") == 0.0


def test_wait_time_takes_nothing(clock):
    buckets = TokenBuckets(rate=1, burst=2, clock=clock)
    for _ in range(5):
        assert buckets.wait_time("k") == 0.0
    buckets.take("k")
    buckets.take("k")
    assert buckets.wait_time("k") == pytest.approx(1.0)


def test_full_buckets_are_evicted(clock):
    buckets = TokenBuckets(rate=1, burst=3, clock=clock)
    for i in range(100):
        buckets.take(f"k{i}")
    assert len(buckets) == 100
    clock.advance(10)  # every bucket is full again: they carry no information
    for i in range(60):
        buckets.take(f"new{i}")
    assert len(buckets) == 60  # each call evicted up to two idle buckets


def test_table_is_bounded(clock):
    buckets = TokenBuckets(rate=0.001, burst=1, clock=clock, max_keys=100)
    for i in range(1000):
        assert buckets.take(f"addr{i}") == 0.0
    assert len(buckets) == 100
    assert buckets.take("addr999") > 0  # the most recent keys are still limited


def test_bad_parameters():
    with pytest.raises(ValueError):
        TokenBuckets(rate=0, burst=3)
    with pytest.raises(ValueError):
        TokenBuckets(rate=1, burst=0)


def test_limit_exceeded_error():
    error = limit_exceeded(0.2501)
    assert error.status == 429 and error.errcode == "M_LIMIT_EXCEEDED"
    assert error.body()["retry_after_ms"] == 251
    assert error.headers == {"Retry-After": "1"}


async def test_login_limits_from_config(clock):
    config = build_config({"rate_limit": {"account_burst": 2, "failed_attempts_burst": 1}})
    limits = LoginLimits.from_config(config.section("rate_limit"), clock)
    await limits.check_account("Alice")
    await limits.check_account("alice")  # case variants share a bucket
    with pytest.raises(Exception) as info:
        await limits.check_account("ALICE")
    assert info.value.status == 429
    clock.advance(100)
    await limits.record_failure("alice")
    with pytest.raises(Exception) as info:
        await limits.check_account("alice")  # failures are over the limit: refused before trying
    assert info.value.status == 429


async def test_disabled_turns_everything_off():
    config = build_config({"rate_limit": {"enabled": False}})
    limits = LoginLimits.from_config(config.section("rate_limit"))
    assert limits.address is limits.account is limits.failures is None
    for _ in range(100):
        await limits.check_address("1.2.3.4")
        await limits.check_account("alice")
        await limits.record_failure("alice")


def test_bad_rate_limit_values_are_config_errors():
    from homeserver.errors import ConfigError

    for bad in ({"address_per_second": 0}, {"account_burst": 0}, {"enabled": "yes"}):
        with pytest.raises(ConfigError):
            build_config({"rate_limit": bad})


LOGIN = "/_matrix/client/v3/login"


def body(user: str = "alice", password: str = "wonderland") -> dict:
    return {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user}, "password": password}


class TestAddressLimit:
    @pytest.fixture
    def config_overrides(self):
        return {"rate_limit": {"address_burst": 3}}

    async def test_over_the_burst(self, fetch):
        for user in ("alice", "bob", "nobody"):  # a burst of 3, whatever the account
            await fetch(LOGIN, "POST", json_body=body(user))
        resp = await fetch(LOGIN, "POST", json_body=body())
        err = assert_error(resp, 429, "M_LIMIT_EXCEEDED")
        assert err["retry_after_ms"] > 0
        assert int(resp.headers["Retry-After"]) >= 1

    async def test_forwarded_for_ignored_from_untrusted_peers(self, fetch):
        for i in range(3):
            await fetch(LOGIN, "POST", json_body=body(), headers={"X-Forwarded-For": f"203.0.113.{i}"})
        resp = await fetch(LOGIN, "POST", json_body=body(), headers={"X-Forwarded-For": "203.0.113.99"})
        assert_error(resp, 429, "M_LIMIT_EXCEEDED")


class TestTrustedProxy:
    @pytest.fixture
    def config_overrides(self):
        return {"rate_limit": {"address_burst": 3}, "server": {"trusted_proxies": ["127.0.0.0/8", "::1"]}}

    async def test_each_forwarded_client_has_its_own_bucket(self, fetch):
        for i in range(6):
            resp = await fetch(LOGIN, "POST", json_body=body(), headers={"X-Forwarded-For": f"203.0.113.{i}"})
            assert_json(resp)
        for _ in range(3):
            await fetch(LOGIN, "POST", json_body=body(), headers={"X-Forwarded-For": "198.51.100.7"})
        resp = await fetch(LOGIN, "POST", json_body=body(), headers={"X-Forwarded-For": "198.51.100.7"})
        assert_error(resp, 429, "M_LIMIT_EXCEEDED")


class TestFailedAttempts:
    @pytest.fixture
    def config_overrides(self):
        return {"rate_limit": {"failed_attempts_burst": 3}}

    async def test_failed_attempts_lock_the_account_not_others(self, fetch):
        for _ in range(3):
            assert_error(await fetch(LOGIN, "POST", json_body=body(password="wrong")), 403, "M_FORBIDDEN")
        # Even the right password is refused now, but another account is unaffected.
        assert_error(await fetch(LOGIN, "POST", json_body=body()), 429, "M_LIMIT_EXCEEDED")
        assert_json(await fetch(LOGIN, "POST", json_body=body("bob", "builder")))

    async def test_unknown_users_count_as_failures(self, fetch):
        for _ in range(3):
            assert_error(await fetch(LOGIN, "POST", json_body=body("nobody")), 403, "M_FORBIDDEN")
        assert_error(await fetch(LOGIN, "POST", json_body=body("nobody")), 429, "M_LIMIT_EXCEEDED")


class TestAccountLimit:
    @pytest.fixture
    def config_overrides(self):
        return {"rate_limit": {"account_burst": 3}}

    async def test_account_limit_counts_successes_too(self, fetch):
        for _ in range(3):
            assert_json(await fetch(LOGIN, "POST", json_body=body()))
        assert_error(await fetch(LOGIN, "POST", json_body=body("ALICE")), 429, "M_LIMIT_EXCEEDED")


class TestDisabled:
    @pytest.fixture
    def config_overrides(self):
        return {"rate_limit": {"enabled": False}}

    async def test_no_limits_at_all(self, fetch):
        for _ in range(10):
            assert_json(await fetch(LOGIN, "POST", json_body=body()))
        for _ in range(10):
            assert_error(await fetch(LOGIN, "POST", json_body=body(password="x")), 403, "M_FORBIDDEN")
