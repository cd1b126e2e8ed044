"""The one name guard, and user IDs built and reduced in one place."""

from __future__ import annotations

import pytest

from backends.base import User, UserBackend
from homeserver.names import local_name, possible_name, user_id
from homeserver.users import Users


@pytest.mark.parametrize("name", ["alice", "Alice", "a.b_c=d-e/f+g", "ünïcode", "a" * 255, "with space"])
def test_possible_names(name):
    assert possible_name(name)


@pytest.mark.parametrize("name", ["", "al\x00ice", "alice\n", "\x7f", "\x85", "\ud800", "a" * 256, "é" * 128])
def test_impossible_names(name):
    assert not possible_name(name)


def test_user_id_and_local_name():
    assert user_id("alice", "example.org") == "@alice:example.org"
    assert local_name("@alice:example.org", "example.org") == "alice"
    # Another server's ID, or text that is no ID, stays as it is: it names nobody here.
    assert local_name("@alice:other.org", "example.org") == "@alice:other.org"
    assert local_name("alice", "example.org") == "alice"
    assert local_name("@alice", "example.org") == "@alice"


class Recording(UserBackend):
    """A backend that records the names it is asked for."""

    name = "recording"

    def __init__(self) -> None:
        self.asked: list[str] = []

    @classmethod
    def from_config(cls, options, *, config_dir):  # pragma: no cover - not configured
        raise NotImplementedError

    async def get_user(self, name, *, case_insensitive=False):
        self.asked.append(name)
        return User(name=name, ident="-") if name == "alice" else None


async def test_users_never_pass_an_impossible_name_to_the_store():
    backend = Recording()
    users = Users(backend)
    assert (await users.get("alice")).name == "alice"
    for name in ["", "al\x00ice", "\ud800", "a" * 300]:
        assert await users.get(name) is None
    assert backend.asked == ["alice"]
