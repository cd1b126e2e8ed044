"""The users file's listing: read as it is now, off the loop; a file caught mid-write (or
otherwise unparsable) is StoreIncomplete, while the server keeps serving its last good copy."""

from __future__ import annotations

import json

import pytest

from backends.base import StoreIncomplete
from tests.support.helpers import record


@pytest.fixture
def user_records():
    return [record(f"user{i}", ident=f"-{i}", display_name=f"User {i}") for i in range(50)]


@pytest.fixture
def config_overrides():
    return {"backend.file": {"reload_interval": 0}}


async def test_a_file_caught_mid_write_makes_the_listing_incomplete(users_path, backend):
    with open(users_path) as fh:
        whole = fh.read()
    with open(users_path, "w") as fh:  # an editor writing in place, halfway through
        fh.write(whole[: len(whole) // 2])
    with pytest.raises(StoreIncomplete, match="malformed JSON") as raised:
        await backend.list_users()
    assert raised.value.users == []
    # The server still answers from what it loaded last; the listing does not pass that off as the store.
    assert (await backend.get_user("user49")).ident == "-49"
    with open(users_path, "w") as fh:
        fh.write(whole)
    assert len(await backend.list_users()) == 50


async def test_an_unchanged_file_is_listed_from_memory_and_a_changed_one_read_again(users_path, backend):
    listed = await backend.list_users()
    assert all(user is backend.users[user.name] for user in listed)  # no second parse
    with open(users_path, "w") as fh:
        json.dump({"users": [record("zed", ident="-z", admin=True)]}, fh)
    (zed,) = await backend.list_users()
    assert (zed.name, zed.ident, zed.admin) == ("zed", "-z", True)
    # What the listing read is what this server serves from then on (a sweep tells Synapse of
    # it: the server's own lookups must not lag behind it), as a reload would have it.
    assert backend.users == {"zed": zed}


async def test_a_listing_of_a_changed_file_queues_its_changes_as_a_reload_does(users_path, backend):
    with open(users_path) as fh:
        users = json.load(fh)["users"]
    users[3]["locked"] = True
    with open(users_path, "w") as fh:
        json.dump({"users": users}, fh)
    await backend.list_users()
    assert backend._changes.get_nowait() == {"user3": ["locked"]}  # the sessions service ends what it must
