"""An unknown name costs the bcrypt work of a wrong password, on the API and on the account page:
the time of a refusal does not tell which names exist. Compared as medians over interleaved
tries (a ratio, never an absolute time), with a hash dear enough that bcrypt dominates."""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable

import pytest

from tests.support.helpers import assert_error, record
from tests.support.page_client import Browser

pytestmark = pytest.mark.usefixtures("io_loop")

ROUNDS = 8  # ~15-60 ms a check: well above a request's own cost, quick enough for a test
TRIES = 7


@pytest.fixture
def user_records():
    from tests.support.helpers import hex_hash

    alice = record("alice", ident="a")
    alice["password"] = hex_hash("wonderland", rounds=ROUNDS)
    return [alice]


@pytest.fixture
def config_overrides():
    # The stand-in hash an unknown name is checked against has the configured cost.
    return {"auth": {"bcrypt_rounds": ROUNDS}}


async def ratio(attempt: Callable[[str], Awaitable[None]]) -> float:
    """median(unknown name) / median(known name, wrong password), tried in turn."""
    times: dict[str, list[float]] = {"nobody": [], "alice": []}
    await attempt("nobody")  # the first makes the stand-in hash: not counted
    for i in range(TRIES):
        for name in ("nobody", "alice") if i % 2 else ("alice", "nobody"):
            start = time.perf_counter()
            await attempt(name)
            times[name].append(time.perf_counter() - start)
    return statistics.median(times["nobody"]) / statistics.median(times["alice"])


async def test_the_api_login(fetch):
    async def attempt(name: str) -> None:
        body = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": name}, "password": "wrong"}
        assert_error(await fetch("/_matrix/client/v3/login", "POST", json_body=body), 403, "M_FORBIDDEN")

    assert 0.5 < await ratio(attempt) < 2.0


async def test_the_account_page_sign_in(fetch):
    browser = Browser(fetch)

    async def attempt(name: str) -> None:
        assert (await browser.sign_in(name, "wrong")).status == 403

    assert 0.5 < await ratio(attempt) < 2.0


async def test_the_stand_in_check_is_counted(fetch, hs):
    before = hs.checker.wasted
    await Browser(fetch).sign_in("nobody", "wrong")
    assert hs.checker.wasted == before + 1
