"""File backend: format checks naming the record, case-folded index, atomic add_user."""

import json
import os
import stat

import pytest

from backends.base import User, UserExists
from backends.file import FileBackend, fold_index, parse_users
from homeserver.errors import ConfigError
from tests.support.helpers import record


def write(path, document):
    path.write_text(json.dumps(document) if not isinstance(document, str) else document)
    return str(path)


@pytest.mark.parametrize(
    "document, needle",
    [
        ("{not json", "malformed JSON"),
        ([], 'an object with a "users" list'),
        ({"users": {}}, 'an object with a "users" list'),
        ({"users": [1]}, "record 0: expected an object"),
        ({"users": [{"name": "ann", "password": "00"}]}, "record 0 ('ann'): missing required field 'ident'"),
        ({"users": [record("ok"), {"name": "ann", "ident": "i"}]}, "record 1 ('ann'): missing required field 'password'"),
        ({"users": [{"password": "00", "ident": "i"}]}, "record 0: missing required field 'name'"),
        ({"users": [{"name": "ann", "password": 5, "ident": "i"}]}, "field 'password' must be a string"),
        ({"users": [{"name": "ann", "password": "00", "ident": "i", "display_name": 1}]}, "field 'display_name'"),
        ({"users": [record("ann"), record("ann")]}, "record 1 ('ann'): duplicate name"),
    ],
)
async def test_malformed_files_are_start_up_errors_naming_the_record(tmp_path, document, needle):
    backend = FileBackend(write(tmp_path / "users.json", document))
    with pytest.raises(ConfigError) as info:
        await backend.start()
    assert needle in str(info.value) and "\n" not in str(info.value)


async def test_missing_file_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"^backend\.file\.path: users file .* not found"):
        await FileBackend(str(tmp_path / "nope.json")).start()


def test_fold_index_keeps_only_unambiguous_names():
    users = parse_users({"users": [record("Ann"), record("bob"), record("BOB")]}, "x")
    assert fold_index(users) == {"ann": "Ann"}


async def test_get_user_exact_then_case_insensitive(tmp_path):
    backend = FileBackend(write(tmp_path / "u.json", {"users": [record("Ann", ident="i", display_name="A")]}))
    await backend.start()
    assert (await backend.get_user("Ann")).display_name == "A"
    assert await backend.get_user("ann") is None
    assert (await backend.get_user("ANN", case_insensitive=True)).name == "Ann"


async def test_add_user_creates_appends_refuses_and_overwrites(tmp_path):
    path = tmp_path / "users.json"
    backend = FileBackend(str(path))
    await backend.add_user(User(name="ann", ident="i", password="00"))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    await backend.add_user(User(name="bob", ident="b", password="11", display_name="Bob", avatar_url="mxc://x/y"))
    with pytest.raises(UserExists):
        await backend.add_user(User(name="ann", ident="other", password="22"))
    await backend.add_user(User(name="ann", ident="new", password="33"), overwrite=True)
    users = json.loads(path.read_text())["users"]
    assert users == [
        {"name": "ann", "password": "33", "ident": "new"},
        {"name": "bob", "password": "11", "ident": "b", "display_name": "Bob", "avatar_url": "mxc://x/y"},
    ]
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []


async def test_add_user_keeps_the_file_mode_and_refuses_a_broken_file(tmp_path):
    path = tmp_path / "users.json"
    write(path, {"users": []})
    os.chmod(path, 0o640)
    backend = FileBackend(str(path))
    await backend.add_user(User(name="ann", ident="i", password="00"))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    write(path, "{broken")
    with pytest.raises(ConfigError):
        await backend.add_user(User(name="bob", ident="i", password="00"))
    assert path.read_text() == "{broken"
