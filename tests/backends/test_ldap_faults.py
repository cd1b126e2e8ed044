"""LDAP directory faults: a hung or dead slapd gives 503 within the timeout, and service recovers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from homeserver.context import create_backend
from homeserver.errors import StoreUnavailable
from tests.support.helpers import assert_error, assert_json
from tests.support.slapd import (
    READER_DN,
    READER_PASSWORD,
    SUFFIX,
    Slapd,
    directory_ldif,
    running_slapd,
)

LOGIN = "/_matrix/client/v3/login"
TIMEOUT = 1.0
# Generous: the bound under test is TIMEOUT; the margin absorbs a slow CI machine.
MARGIN = 1.5


@pytest.fixture(scope="module")
def own_slapd() -> Iterator[Slapd]:
    """A directory of this module's own, since these tests stop and kill it."""
    yield from running_slapd(directory_ldif())


@pytest.fixture
def directory(own_slapd) -> Iterator[Slapd]:
    """The module's slapd, running and answering again after each test."""
    yield own_slapd
    if own_slapd.process is None:
        own_slapd.start(own_slapd.port)
    else:
        own_slapd.resume()


@pytest.fixture
def mode() -> str:
    return "hash"


@pytest.fixture
def config_overrides(directory, mode) -> dict[str, dict[str, Any]]:
    return {
        "backend": {"type": "ldap"},
        "backend.ldap": {
            "uri": directory.uri,
            "base": SUFFIX,
            "bind_dn": READER_DN,
            "bind_password": READER_PASSWORD,
            "mode": mode,
            "timeout": TIMEOUT,
        },
    }


@pytest.fixture
def fetch(fetch, app):
    """Name `app` so pytest sees that `mode` reaches it (pytest-tornasync finds it at run time)."""
    return fetch


def body(user: str = "alice", password: str = "wonderland") -> dict[str, Any]:
    return {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user}, "password": password}


async def timed_login(fetch, **kwargs: Any) -> tuple[Any, float]:
    start = time.monotonic()
    resp = await fetch(LOGIN, "POST", json_body=body(**kwargs))
    return resp, time.monotonic() - start


def assert_unavailable(resp) -> None:
    assert_error(resp, 503, "M_UNKNOWN")
    assert int(resp.headers["Retry-After"]) > 0, resp


async def eventually_logs_in(fetch, limit: float = 5.0) -> int:
    """Log in until it works; return how many attempts failed first."""
    deadline = time.monotonic() + limit
    failures = 0
    while True:
        resp, _ = await timed_login(fetch)
        if resp.status == 200:
            return failures
        assert_unavailable(resp)
        failures += 1
        assert time.monotonic() < deadline, "the service did not recover"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("mode", ["hash", "bind"])
@pytest.mark.parametrize("warm", [True, False], ids=["reused-connection", "new-connection"])
async def test_hung_directory_is_503_within_the_timeout_and_recovers(fetch, directory, warm):
    if warm:
        assert_json((await timed_login(fetch))[0])
    directory.pause()
    try:
        # Another endpoint answers at once while a login waits on the directory.
        login_task = asyncio.ensure_future(timed_login(fetch))
        await asyncio.sleep(0.1)
        start = time.monotonic()
        assert_json(await fetch("/_matrix/client/versions"))
        assert time.monotonic() - start < 0.5
        resp, elapsed = await login_task
        assert_unavailable(resp)
        assert elapsed < TIMEOUT + MARGIN, elapsed
        # Profiles fail the same way, also within the timeout.
        start = time.monotonic()
        assert_unavailable(await fetch("/_matrix/client/v3/profile/@alice:localhost"))
        assert time.monotonic() - start < TIMEOUT + MARGIN
    finally:
        directory.resume()
    await eventually_logs_in(fetch)


@pytest.mark.parametrize("mode", ["bind"])
async def test_directory_hanging_between_lookup_and_bind(backend, directory):
    user = await backend.get_user("alice")
    directory.pause()
    try:
        start = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await backend.verify_password(user, "wonderland")
        assert time.monotonic() - start < TIMEOUT + MARGIN
    finally:
        directory.resume()


async def test_many_logins_during_a_hang_all_get_503_in_time(fetch, directory):
    # More requests than LDAP worker threads: queued ones must time out too.
    directory.pause()
    try:
        results = await asyncio.gather(*(timed_login(fetch) for _ in range(10)))
    finally:
        directory.resume()
    for resp, elapsed in results:
        assert_unavailable(resp)
        assert elapsed < TIMEOUT + MARGIN, elapsed
    await eventually_logs_in(fetch)


@pytest.mark.parametrize("mode", ["hash", "bind"])
async def test_killed_directory_is_503_and_a_restart_recovers(fetch, directory):
    assert_json((await timed_login(fetch))[0])
    directory.kill()
    resp, elapsed = await timed_login(fetch)
    assert_unavailable(resp)
    assert elapsed < TIMEOUT + MARGIN
    assert_json(await fetch("/_matrix/client/versions"))
    directory.start(directory.port)
    # Stale connections are replaced on their next use: the first login works.
    assert await eventually_logs_in(fetch) == 0


async def test_check_health_follows_the_directory(backend, directory):
    await backend.check_health()
    directory.pause()
    try:
        with pytest.raises(StoreUnavailable):
            await backend.check_health()
    finally:
        directory.resume()
    for _ in range(50):
        try:
            await backend.check_health()
            break
        except StoreUnavailable:
            await asyncio.sleep(0.1)
    else:
        pytest.fail("check_health did not recover")


async def test_start_with_the_directory_down_then_up(make_config, config_overrides, directory):
    directory.kill()
    backend = create_backend(make_config(config_overrides))
    try:
        await backend.start()  # logs a warning, does not fail
        with pytest.raises(StoreUnavailable):
            await backend.get_user("alice")
        directory.start(directory.port)
        assert (await backend.get_user("alice")).name == "alice"
    finally:
        await backend.close()
