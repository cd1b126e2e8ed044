"""The whole-store listing (`UserBackend.list_users`) and the admin / second-factor flags, the
same contract over the users file, a real Redis and a real slapd (tests/backends/listing_stores.py).

The listing is what a sweep of the store works from: every user, with all a lookup gives
(so no second lookup per user), and `StoreIncomplete` rather than a shorter list whenever
the store could not be read whole.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from backends.base import StoreIncomplete, User
from tests.backends.listing_stores import NAMES, ListedStore, listed_store


@pytest.fixture(params=["file", "redis", "ldap"])
def store(request, tmp_path) -> Iterator[ListedStore]:
    yield from listed_store(request.param, tmp_path)


@pytest.fixture
def config_overrides(store):
    return store.overrides


def by_name(users: list[User]) -> dict[str, User]:
    names = [user.name for user in users]
    assert len(names) == len(set(names)), names
    return {user.name: user for user in users}


async def test_every_user_is_listed_with_what_a_lookup_gives(backend):
    listed = by_name(await backend.list_users())
    assert set(listed) == NAMES
    for name, user in listed.items():
        # Everything the profile rules and a sweep need (display name, ident, avatar, e-mail,
        # locked, admin, second factor), exactly as the lookup of that user has it.
        assert user == await backend.get_user(name)
    assert listed["alice"].display_name == "Alice"
    assert listed["alice"].ident == "alice-id"
    assert listed["alice"].avatar_url == "mxc://localhost/alice"
    assert listed["carol"].email == "Carol@Example.org"


async def test_admin_mfa_required_and_locked_come_from_the_store(backend):
    listed = by_name(await backend.list_users())
    assert {name for name, user in listed.items() if user.admin} == {"alice"}
    assert {name for name, user in listed.items() if user.mfa_required} == {"carol"}
    assert {name for name, user in listed.items() if user.locked} == {"bob"}
    alice, carol, dave = [await backend.get_user(name) for name in ("alice", "carol", "dave")]
    assert (alice.admin, alice.mfa_required) == (True, False)
    assert (carol.admin, carol.mfa_required) == (False, True)
    assert (dave.admin, dave.mfa_required, dave.locked) == (False, False, False)


async def test_a_removed_user_is_no_longer_listed(store, backend):
    await backend.list_users()
    store.remove("bob")
    assert set(by_name(await backend.list_users())) == NAMES - {"bob"}


async def test_a_malformed_record_makes_the_listing_incomplete(store, backend):
    store.break_record("dave")
    with pytest.raises(StoreIncomplete) as raised:
        await backend.list_users()
    if store.kind == "file":
        # The file is one document: it fails as a whole, naming the record.
        assert "'dave'" in str(raised.value) and "ident" in str(raised.value)
        assert raised.value.users == []
    else:
        # The others stay usable; dave is named, so no one takes him for gone.
        assert set(by_name(raised.value.users)) == NAMES - {"dave"}
        assert raised.value.unreadable == ["dave"]
        assert "ident" in str(raised.value)


async def test_a_store_that_cannot_be_reached_makes_the_listing_incomplete(store, backend):
    store.stop()
    with pytest.raises(StoreIncomplete) as raised:
        await backend.list_users()
    assert raised.value.users == []
    assert str(raised.value)
    assert "\n" not in str(raised.value)
