"""add_user on the users file: replace keeps what is not given, owner and mode kept, no lock file, serialised."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import stat

import pytest

from backends.base import User, UserIncomplete
from backends.file import FileBackend
from homeserver.errors import ConfigError
from tests.support.helpers import record


def write(path, users):
    path.write_text(json.dumps({"users": users}))
    return str(path)


def stored(path):
    return json.loads(path.read_text())["users"]


async def test_add_then_replace_reports_which(tmp_path):
    backend = FileBackend(str(tmp_path / "users.json"))
    assert await backend.add_user(User(name="ann", ident="i", password="00")) is False
    assert await backend.add_user(User(name="ann", ident="j", password="11"), overwrite=True) is True


async def test_replace_keeps_the_fields_not_given(tmp_path):
    path = tmp_path / "users.json"
    old = record("ann", ident="-a", display_name="Ann", avatar_url="mxc://x/a", email="ann@example.org", extra=1)
    write(path, [old, record("bob")])
    backend = FileBackend(str(path))
    # A new password and avatar; ident, display name and e-mail not given: kept.
    new = User(name="ann", ident="", password="00", avatar_url="mxc://x/new")
    assert await backend.add_user(new, overwrite=True, keep=("ident", "display_name", "email")) is True
    ann, bob = stored(path)
    assert ann == {**old, "password": "00", "avatar_url": "mxc://x/new"}  # same keys, same order
    assert bob == record("bob") | {"password": bob["password"]}


async def test_replace_removes_a_field_given_as_none_and_can_keep_the_password(tmp_path):
    path = tmp_path / "users.json"
    old = record("ann", ident="-a", display_name="Ann", avatar_url="mxc://x/a")
    write(path, [old])
    user = User(name="ann", ident="-b", password=None, display_name=None, avatar_url=None)
    await FileBackend(str(path)).add_user(user, overwrite=True, keep=("password", "avatar_url"))
    assert stored(path) == [{"name": "ann", "password": old["password"], "ident": "-b", "avatar_url": "mxc://x/a"}]


async def test_keeping_required_fields_of_a_user_that_does_not_exist(tmp_path):
    path = tmp_path / "users.json"
    write(path, [])
    with pytest.raises(UserIncomplete) as caught:
        await FileBackend(str(path)).add_user(User(name="ann", ident=""), overwrite=True, keep=("password", "ident"))
    assert caught.value.fields == ["password", "ident"]
    assert stored(path) == []


async def test_replacing_fixes_a_record_the_server_refuses(tmp_path):
    path = tmp_path / "users.json"
    plain = bytes.fromhex(record("x")["password"]).decode()  # a bcrypt hash pasted as is
    write(path, [record("bob"), {**record("ann"), "password": plain}])
    backend = FileBackend(str(path))
    with pytest.raises(ConfigError, match=r"record 1 \('ann'\): field 'password'"):
        await backend.start()
    await backend.add_user(User(name="ann", ident="-a", password=record("x")["password"]), overwrite=True)
    await backend.start()
    assert sorted(backend.users) == ["ann", "bob"]


async def test_no_lock_file_or_temporary_file_is_left(tmp_path):
    path = tmp_path / "users.json"
    backend = FileBackend(str(path))
    await backend.add_user(User(name="ann", ident="i", password="00"))
    await backend.add_user(User(name="ann", ident="j", password="00"), overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["users.json"]


async def test_a_symlinked_users_file_is_written_where_it_lives(tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "users.json"
    write(target, [])
    link = tmp_path / "users.json"
    link.symlink_to(target)
    await FileBackend(str(link)).add_user(User(name="ann", ident="i", password="00"))
    assert link.is_symlink() and [u["name"] for u in stored(target)] == ["ann"]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another owner needs root")
async def test_root_keeps_the_owner_group_and_mode(tmp_path):
    path = tmp_path / "users.json"
    write(path, [])
    os.chown(path, 0, 65534)  # root:nogroup, as root:homeserver under systemd
    os.chmod(path, 0o640)
    backend = FileBackend(str(path))
    await backend.add_user(User(name="ann", ident="i", password="00"))
    os.chown(path, 65534, 65534)  # and a file the service user owns
    await backend.add_user(User(name="ann", ident="j", password="00"), overwrite=True)
    st = os.stat(path)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (65534, 65534, 0o640)
    assert stored(path)[0]["ident"] == "j"


def _add_many(path: str, names: list[str]) -> None:
    import asyncio

    backend = FileBackend(path)
    for name in names:
        asyncio.run(backend.add_user(User(name=name, ident="i", password="00")))


def test_concurrent_writers_lose_nothing(tmp_path):
    # Without the lock, two read-modify-write cycles interleave and one's user is lost.
    path = str(tmp_path / "users.json")
    write(tmp_path / "users.json", [])
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_add_many, args=(path, [f"u{p}x{i}" for i in range(15)])) for p in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    assert len({u["name"] for u in stored(tmp_path / "users.json")}) == 60
    assert sorted(os.listdir(tmp_path)) == ["users.json"]


# -- modes: a users file holds password hashes, so no write leaves it readable by others ---------


async def test_a_new_users_file_is_the_owners_alone(tmp_path):
    path = tmp_path / "users.json"
    await FileBackend(str(path)).add_user(User(name="ann", ident="i", password="00"))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


@pytest.mark.parametrize(
    "before, after",
    [(0o644, 0o640), (0o666, 0o660), (0o604, 0o600), (0o640, 0o640), (0o600, 0o600), (0o400, 0o400)],
)
async def test_a_rewritten_users_file_loses_access_for_others_and_keeps_a_stricter_mode(tmp_path, before, after):
    path = tmp_path / "users.json"
    write(path, [record("bob")])
    os.chmod(path, before)
    backend = FileBackend(str(path))
    await backend.add_user(User(name="ann", ident="i", password="00"))
    assert stat.S_IMODE(os.stat(path).st_mode) == after
    os.chmod(path, before)
    assert await backend.set_locked("ann", True)  # lock and unlock rewrite it alike
    assert stat.S_IMODE(os.stat(path).st_mode) == after
    assert [u["name"] for u in stored(path)] == ["bob", "ann"]


@pytest.mark.parametrize("mode, warned", [(0o644, True), (0o604, True), (0o640, False), (0o600, False)])
async def test_the_server_warns_at_start_of_a_users_file_others_may_read(tmp_path, caplog, mode, warned):
    path = write(tmp_path / "users.json", [record("bob")])
    os.chmod(path, mode)
    backend = FileBackend(path)
    with caplog.at_level(logging.WARNING):
        await backend.start()
        await backend.close()
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    expected = f"backend.file.path {path} can be accessed by others (mode {mode:04o}); chmod o-rwx it"
    assert lines == ([expected] if warned else [])
