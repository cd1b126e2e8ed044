"""Login limits shared through the session store: one burst for every worker, a local fallback."""

from __future__ import annotations

import logging

import pytest

from backends.base import StoreUnavailable
from backends.sessions import create_session_store
from homeserver.config import build_config
from homeserver.errors import MatrixError
from homeserver.ratelimit import LoginLimits
from tests.support.servers import Server, login, write_config

# An address burst of 3 that does not refill during a test; the other limits out of the way.
LIMITS = "[rate_limit]\naddress_burst = 3\naccount_burst = 1000\nfailed_attempts_burst = 1000\naddress_per_second = 0.001\n"


def limits_on(store, clock=None, **section) -> LoginLimits:
    config = build_config({"rate_limit": {"account_burst": 3, "address_burst": 3, **section}})
    kwargs = {"clock": clock} if clock else {}
    return LoginLimits.from_config(config.section("rate_limit"), shared=store, **kwargs)


@pytest.fixture
def two_stores(tmp_path, io_loop):
    """Two store instances on one SQLite file, as two worker processes have."""
    options = {"path": str(tmp_path / "s.db"), "timeout": 1.0, "keep_ended": 60.0}
    stores = [create_session_store("sqlite", options, config_dir=str(tmp_path)) for _ in range(2)]
    for store in stores:
        io_loop.run_sync(store.start)
    yield stores
    for store in stores:
        io_loop.run_sync(store.close)


async def test_two_processes_share_one_burst(two_stores):
    a, b = (limits_on(store.buckets()) for store in two_stores)
    await a.check_address("10.0.0.1")
    await b.check_address("10.0.0.1")
    await a.check_address("10.0.0.1")
    with pytest.raises(Exception) as info:
        await b.check_address("10.0.0.1")
    assert info.value.status == 429 and info.value.extra["retry_after_ms"] > 0
    await b.check_address("10.0.0.2")  # other addresses have their own bucket
    # Failures recorded by one are seen by the other.
    await a.record_failure("Alice")
    await a.record_failure("alice")
    await a.record_failure("ALICE")
    with pytest.raises(MatrixError):
        await b.check_failures("alice")


class Broken:
    """A shared store that cannot answer until `up` is set."""

    def __init__(self, inner=None):
        self.up = False
        self.calls = 0
        self.inner = inner

    async def rate_limit(self, key, interval, capacity, *, take=True):
        self.calls += 1
        if not self.up:
            raise StoreUnavailable("paused", store="session store")
        return 0.0


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


async def test_a_store_that_cannot_answer_falls_back_to_local_buckets_and_recovers(caplog):
    store, clock = Broken(), Clock()
    limits = limits_on(store, clock)
    fallbacks = []
    limits.on_fallback = lambda: fallbacks.append(1)
    with caplog.at_level(logging.WARNING, "homeserver.ratelimit"):
        for _ in range(3):
            await limits.check_address("10.0.0.1")
        # The local bucket still limits: neither everything through nor everyone refused.
        with pytest.raises(Exception) as info:
            await limits.check_address("10.0.0.1")
        assert info.value.status == 429
        await limits.check_address("10.0.0.9")
    assert store.calls == 1  # not asked again before retry_shared has passed
    assert len(fallbacks) == limits.fallbacks == 1
    unavailable = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(unavailable) == 1  # logged once
    store.up = True
    clock.now += limits.retry_shared
    caplog.clear()
    with caplog.at_level(logging.WARNING, "homeserver.ratelimit"):
        await limits.check_address("10.0.0.1")  # the shared store answers again
    assert store.calls == 2
    assert any("answer again" in r.getMessage() for r in caplog.records)


async def test_shared_can_be_turned_off(two_stores):
    limits = limits_on(two_stores[0].buckets(), shared=False)
    assert limits.shared is None


def test_workers_of_one_server_share_one_burst(tmp_path):
    conf = write_config(tmp_path, LIMITS)
    server = Server("--config", conf, "--processes", "2")
    try:
        statuses = [login(server.port, "bob", "wrong")[0] for _ in range(8)]
    finally:
        server.stop()
    # New connections spread over both workers; a per-process limit would allow 6.
    assert statuses[:3] == [403, 403, 403] and set(statuses[3:]) == {429}, statuses


def test_store_keys_are_text_and_bounded():
    from homeserver.ratelimit import store_key

    assert store_key("account", "alice") == "account:alice"
    assert store_key("account", "\ud800") == "account:\\ud800"
    long = store_key("account", "a" * 10_000)
    assert long.startswith("account:#") and len(long) < 80
    assert store_key("account", "a" * 10_000) == long != store_key("account", "b" * 10_000)
