"""One person's requests at once (two browser tabs, a double click), through the service on the
real stores, SQLite and Redis, whose every call lets the other request in: what the first
factor brings comes once, and a person who must keep a second factor keeps one."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace

import pytest

from backends.base import User
from backends.sessions import create_session_store
from backends.sessions.factors import RECOVERY, TOTP, WEBAUTHN
from homeserver.mfa.limits import WrongCodeLimit
from homeserver.mfa.passkeys import RelyingParty
from homeserver.mfa.sealing import Keyring
from homeserver.mfa.second_step import SecondStep
from homeserver.mfa.service import LastFactor, SecondFactors
from tests.backends.test_session_store import store_options
from tests.mfa.authenticator import SoftAuthenticator
from tests.support.redis_servers import redis_url  # noqa: F401  (fixture)
from tests.support.second_factors import App

KEY = "the operator's key, at least 32 bytes"
RP = RelyingParty.from_base_url("https://matrix.example.org", "example.org")


@pytest.fixture(params=["sqlite", "redis"])
def factor_stores(request, tmp_path, io_loop):
    """The factor stores of two server processes on one SQLite file or one Redis (one
    process's own calls may not interleave: a Redis pool gives its connection back to the
    caller that just used it)."""
    options = store_options(request.param, tmp_path, request)
    stores = [create_session_store(request.param, dict(options), config_dir=str(tmp_path)) for _ in range(2)]
    for store in stores:
        io_loop.run_sync(store.start)
    yield [store.factors() for store in stores]
    for store in stores:
        io_loop.run_sync(store.close)


@pytest.fixture
def servers(factor_stores) -> list[SecondFactors]:
    """The service in each of the two processes."""
    return [SecondFactors(store, Keyring(KEY), WrongCodeLimit(1 / 60, 5, None), issuer="example.org",
                          relying_party=RP) for store in factor_stores]


async def test_two_first_factors_at_once_bring_one_set_of_recovery_codes(servers):
    """Two tabs adding an app each and a third a passkey, at once, on either process: all three
    are kept, and one page shows the recovery codes, the set that works (not a set another
    page's replaced)."""
    one, two = servers
    tabs = [await one.begin_totp("alice") for _ in range(2)]
    key = SoftAuthenticator(origin=RP.origin, rp_id=RP.rp_id)
    options = await one.begin_passkey("alice", "Alice")
    added = await asyncio.gather(
        one.finish_totp("alice", tabs[0].pending, App(tabs[0].secret).code()),
        two.finish_totp("alice", tabs[1].pending, App(tabs[1].secret).code()),
        two.finish_passkey("alice", key.create(options)),
    )
    shown = [a.recovery_codes for a in added if a.recovery_codes]
    assert len(shown) == 1 and len(shown[0]) == 10, shown
    kept = await one.factors("alice")
    assert sorted(f.kind for f in kept) == [RECOVERY, TOTP, TOTP, WEBAUTHN]
    assert {a.factor.factor_id for a in added} < {f.factor_id for f in kept}
    passed = await two.check_code("alice", shown[0][0])
    assert (passed.kind, passed.recovery_left) == (RECOVERY, 9)


async def test_of_removals_at_once_that_must_keep_one_one_is_refused(servers):
    """A person who must have a second factor removes both of theirs at once, on either
    process: one goes, the other is refused (LastFactor), and their codes stay with the one
    left. Someone who need not keep one removes both."""
    one, two = servers
    for user in ("carol", "bob"):
        for service in servers:
            enrolment = await service.begin_totp(user)
            await service.finish_totp(user, enrolment.pending, App(enrolment.secret).code())
    carols = [f.factor_id for f in await one.factors("carol") if f.kind == TOTP]
    outcomes = await asyncio.gather(
        one.remove("carol", carols[0], keep_one=True), two.remove("carol", carols[1], keep_one=True),
        return_exceptions=True,
    )
    assert [o for o in outcomes if not isinstance(o, LastFactor)] == [True], outcomes
    assert sorted(f.kind for f in await two.factors("carol")) == [RECOVERY, TOTP]
    bobs = [f.factor_id for f in await one.factors("bob") if f.kind == TOTP]
    assert await asyncio.gather(one.remove("bob", bobs[0]), two.remove("bob", bobs[1])) == [True, True]
    assert await one.factors("bob") == []


async def test_the_only_factor_removed_while_another_is_added_leaves_codes_that_work(servers):
    """Alice removes her only app on one process while adding another on the other, the add
    coming in as the removal has taken the app out (before it took the codes): she keeps the
    new app, with recovery codes, and they are the ones the adding page showed."""
    one, two = servers
    enrolment = await one.begin_totp("alice")
    await one.finish_totp("alice", enrolment.pending, App(enrolment.secret).code())
    (only,) = [f.factor_id for f in await one.factors("alice") if f.kind == TOTP]
    tab = await two.begin_totp("alice")
    removal_read, codes_tried = asyncio.Event(), asyncio.Event()
    reads, removals = one.store.factors, one.store.remove_factor
    add_factor, add_codes = two.store.add_factor, two.store.add_recovery_codes

    async def read(user):
        found = await reads(user)
        removal_read.set()
        return found

    async def remove(user, factor_id, **keep):
        if removal_read.is_set():  # the codes, after the read: once the add has tried to add its own
            await codes_tried.wait()
        return await removals(user, factor_id, **keep)

    async def adding(factor):
        await removal_read.wait()
        return await add_factor(factor)

    async def codes(factor):
        try:
            return await add_codes(factor)
        finally:
            codes_tried.set()

    async def removing():
        try:
            return await one.remove("alice", only)
        finally:
            removal_read.set()  # a removal in one step reads nothing after it

    one.store.factors, one.store.remove_factor = read, remove
    two.store.add_factor, two.store.add_recovery_codes = adding, codes
    removed, added = await asyncio.gather(removing(), two.finish_totp("alice", tab.pending, App(tab.secret).code()))
    assert removed is True
    kept = await two.factors("alice")
    assert sorted(f.kind for f in kept) == [RECOVERY, TOTP], kept
    assert len(added.recovery_codes) == 10
    passed = await one.check_code("alice", added.recovery_codes[0])
    assert (passed.kind, passed.recovery_left) == (RECOVERY, 9)


async def test_a_pending_sign_in_is_taken_once_and_given_back(servers):
    """The second step's POSTs of one pending sign-in at once, on either process: one takes it;
    given back (what was typed did not pass), it can be taken again, once."""
    fingerprint = SimpleNamespace(identity="i", password="p")
    page = SimpleNamespace(credentials=SimpleNamespace(of=lambda user: fingerprint))
    steps = [SecondStep(service, None, page) for service in servers]  # type: ignore[arg-type]
    pending = await steps[0].begin(User("alice", "alice"), "/account/", "account page")
    taken = await asyncio.gather(*(step.take(pending) for step in steps * 2))
    assert len([t for t in taken if t is not None]) == 1, taken
    await steps[1].give_back(next(t for t in taken if t is not None))
    again = await asyncio.gather(*(step.take(pending) for step in steps))
    assert len([t for t in again if t is not None]) == 1, again
    forged = replace(pending, nonce="A" * 43)  # another nonce: unknown
    assert await steps[0].take(forged) is None
