"""The OAuth store's device authorizations (RFC 8628), the same contract on SQLite and on a real Redis."""

from __future__ import annotations

import asyncio

from backends.sessions.oauth import APPROVED, DENIED, PENDING, USED
from tests.backends.test_oauth_store import oauth_store, session_store  # noqa: F401 - the fixtures

RECORD = {"client_id": "c1", "device_id": "D1", "scope": "s", "expires_ts": 1}


async def test_a_user_code_finds_its_authorization_and_is_never_given_twice(oauth_store):  # noqa: F811
    assert await oauth_store.add_device_code("dev1", "user1", RECORD, 60) is True
    found = await oauth_store.device_code_by_user_code("user1")
    assert (found.device_hash, found.record, found.state, found.decision) == ("dev1", RECORD, PENDING, {})
    assert await oauth_store.add_device_code("dev2", "user1", RECORD, 60) is False  # a live user code
    assert await oauth_store.device_code_by_user_code("unknown") is None
    assert await oauth_store.poll_device_code("dev2", 1, 1) is None  # the refused one was not kept


async def test_a_decision_is_taken_once(oauth_store):  # noqa: F811
    await oauth_store.add_device_code("dev1", "user1", RECORD, 60)
    results = await asyncio.gather(
        oauth_store.decide_device_code("dev1", APPROVED, {"user": "alice"}),
        oauth_store.decide_device_code("dev1", DENIED, {"user": "bob"}),
    )
    assert sorted(results) == [False, True]
    found = await oauth_store.device_code_by_user_code("user1")
    assert found.state in (APPROVED, DENIED) and found.decision["user"] == ("alice" if found.state == APPROVED else "bob")
    assert await oauth_store.decide_device_code("unknown", APPROVED, {}) is False


async def test_polls_keep_their_time_and_an_approval_is_used_once(oauth_store):  # noqa: F811
    await oauth_store.add_device_code("dev1", "user1", RECORD, 60)
    first = await oauth_store.poll_device_code("dev1", 10_000, 5000)
    assert (first.state, first.too_soon) == (PENDING, False)
    soon = await oauth_store.poll_device_code("dev1", 12_000, 5000)
    assert (soon.state, soon.too_soon) == (PENDING, True)
    await oauth_store.decide_device_code("dev1", APPROVED, {"user": "alice"})
    # Too soon after the previous poll (12 000): the approval stays for the next one.
    early = await oauth_store.poll_device_code("dev1", 13_000, 5000)
    assert (early.state, early.too_soon) == (APPROVED, True)
    polls = await asyncio.gather(*(oauth_store.poll_device_code("dev1", 30_000 + i, 0) for i in range(4)))
    assert sorted(p.state for p in polls) == [APPROVED, USED, USED, USED]
    assert next(p for p in polls if p.state == APPROVED).decision == {"user": "alice"}
    assert (await oauth_store.device_code_by_user_code("user1")).state == USED
    assert await oauth_store.decide_device_code("dev1", DENIED, {}) is False  # used: no second answer


async def test_authorizations_expire_and_free_their_user_code(oauth_store):  # noqa: F811
    await oauth_store.add_device_code("dev1", "user1", RECORD, 0.05)
    await asyncio.sleep(0.15)
    assert await oauth_store.device_code_by_user_code("user1") is None
    assert await oauth_store.poll_device_code("dev1", 1, 1) is None
    assert await oauth_store.decide_device_code("dev1", APPROVED, {}) is False
    assert await oauth_store.add_device_code("dev2", "user1", RECORD, 60) is True



async def test_a_used_approval_can_be_given_back(oauth_store):  # noqa: F811
    await oauth_store.add_device_code("dev1", "user1", RECORD, 60)
    await oauth_store.decide_device_code("dev1", APPROVED, {"user": "alice"})
    assert (await oauth_store.poll_device_code("dev1", 1, 0)).state == APPROVED  # now used
    assert await oauth_store.decide_device_code("dev1", APPROVED, {"user": "alice"}) is False  # not pending
    assert await oauth_store.decide_device_code("dev1", APPROVED, {"user": "alice"}, expected=USED) is True
    assert (await oauth_store.poll_device_code("dev1", 2, 0)).state == APPROVED
