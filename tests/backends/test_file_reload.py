"""Hot reload of the users file: polling, reload() (SIGHUP), broken and missing files."""

from __future__ import annotations

import asyncio
import json
import logging
import os

import pytest

from backends.file import FileBackend, write_atomically
from homeserver.errors import ConfigError
from tests.support.helpers import DEFAULT_USERS, assert_error, assert_json, record


def write_users(path: str, records: list[dict]) -> None:
    write_atomically(path, json.dumps({"users": records}).encode())


async def wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def reload_errors(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "backends.file" and r.levelno == logging.ERROR]


async def test_poll_picks_up_a_changed_file(users_path):
    backend = FileBackend(users_path, reload_interval=0.02)
    await backend.start()
    try:
        assert await backend.get_user("carol") is None
        write_users(users_path, [*DEFAULT_USERS, record("carol")])
        await wait_for(lambda: "carol" in backend.users)
        assert (await backend.get_user("CAROL", case_insensitive=True)).name == "carol"
    finally:
        await backend.close()


async def test_in_place_rewrite_is_seen(users_path):
    backend = FileBackend(users_path, reload_interval=0.02)
    await backend.start()
    try:
        with open(users_path, "w") as fh:  # same inode: size and mtime tell
            json.dump({"users": [record("dave")]}, fh)
        await wait_for(lambda: "dave" in backend.users)
        assert "alice" not in backend.users
    finally:
        await backend.close()


async def test_reload_now_without_polling(users_path):
    backend = FileBackend(users_path)
    await backend.start()
    write_users(users_path, [record("erin")])
    assert await backend.reload() is True
    assert list(backend.users) == ["erin"]
    await backend.close()


async def test_broken_file_keeps_last_good_users_and_logs_once(users_path, caplog):
    backend = FileBackend(users_path, reload_interval=0.02)
    await backend.start()
    try:
        with open(users_path, "w") as fh:
            fh.write('{"users": [')  # half-written
        await wait_for(lambda: reload_errors(caplog))
        await asyncio.sleep(0.2)  # several more polls of the same broken version
        assert len(reload_errors(caplog)) == 1
        assert "keeping the 2 users" in reload_errors(caplog)[0].getMessage()
        assert await backend.get_user("alice") is not None

        write_users(users_path, [{"name": "x"}])  # another broken version: one more error
        await wait_for(lambda: len(reload_errors(caplog)) == 2)

        write_users(users_path, [record("frank")])
        await wait_for(lambda: "frank" in backend.users)
        assert "alice" not in backend.users
    finally:
        await backend.close()


async def test_missing_file_keeps_users(users_path, caplog):
    backend = FileBackend(users_path, reload_interval=0.02)
    await backend.start()
    try:
        os.unlink(users_path)
        await wait_for(lambda: reload_errors(caplog))
        await asyncio.sleep(0.1)
        assert len(reload_errors(caplog)) == 1
        assert "alice" in backend.users
        write_users(users_path, [record("gina")])
        await wait_for(lambda: "gina" in backend.users)
    finally:
        await backend.close()


async def test_start_with_a_broken_file_is_an_error(tmp_path):
    path = tmp_path / "users.json"
    path.write_text("not json")
    with pytest.raises(ConfigError, match="malformed JSON"):
        await FileBackend(str(path)).start()


async def test_close_stops_polling(users_path):
    backend = FileBackend(users_path, reload_interval=0.02)
    await backend.start()
    await backend.close()
    write_users(users_path, [record("hank")])
    await asyncio.sleep(0.1)
    assert "hank" not in backend.users


def test_reload_interval_comes_from_config(make_config):
    from homeserver.context import create_backend

    backend = create_backend(make_config({"backend.file": {"reload_interval": 2.5}}))
    assert backend.reload_interval == 2.5
    assert create_backend(make_config()).reload_interval == 5.0


async def test_token_of_a_removed_user_is_rejected(fetch, login, backend, users_path):
    token = (await login())["access_token"]
    assert_json(await fetch("/_matrix/client/v3/account/whoami", token=token))
    write_users(users_path, [r for r in DEFAULT_USERS if r["name"] != "alice"])
    assert await backend.reload() is True
    assert_error(await fetch("/_matrix/client/v3/account/whoami", token=token), 401, "M_UNKNOWN_TOKEN")
    assert_error(await fetch("/_matrix/client/v3/profile/@alice:localhost"), 404, "M_NOT_FOUND")


@pytest.mark.parametrize("local", [True, False], ids=["stat-on-the-loop", "stat-off-the-loop"])
async def test_a_lookup_sees_a_changed_file_without_waiting_for_the_poll(users_path, monkeypatch, local):
    """The lookup's own check (every FRESHNESS seconds): on a local disk a stat on the loop, on
    a network filesystem a round trip to a thread; either way the next lookup sees the change,
    while the poll itself runs once a minute."""
    monkeypatch.setattr("backends.file.on_local_disk", lambda path: local)
    monkeypatch.setattr("backends.file.FRESHNESS", 0.0)
    backend = FileBackend(users_path, reload_interval=60)
    await backend.start()
    try:
        assert backend._stat_inline is local
        assert (await backend.get_user("alice")).locked is False
        write_users(users_path, [record("alice", locked=True), record("carol")])
        assert (await backend.get_user("alice")).locked is True
        assert (await backend.get_user("carol")).name == "carol"
        write_users(users_path, [record("alice")])
        assert await backend.get_user("carol") is None
    finally:
        await backend.close()



async def test_a_lookup_that_finds_the_file_changed_during_a_reload_waits_for_it(users_path, monkeypatch):
    """A lookup's check finding a new version while the poller's read of it is under way (a
    slow disk, a busy machine) waits for that read; before, it answered from the copy before
    the change (an unlocked account still locked, a removed one still there)."""
    monkeypatch.setattr("backends.file.FRESHNESS", 0.0)
    backend = FileBackend(users_path, reload_interval=60)
    await backend.start()
    reading = asyncio.Event()
    go_on = asyncio.Event()
    from backends import file

    read = file.read_versioned

    def slow_read(path, check_passwords=True):  # on the executor's thread
        loop.call_soon_threadsafe(reading.set)
        asyncio.run_coroutine_threadsafe(go_on.wait(), loop).result(5)
        return read(path, check_passwords)

    loop = asyncio.get_running_loop()
    monkeypatch.setattr(file, "read_versioned", slow_read)
    try:
        write_users(users_path, [record("alice", locked=True)])
        poll = asyncio.ensure_future(backend.reload(force=False))  # the poller's read, held
        await reading.wait()
        lookup = asyncio.ensure_future(backend.get_user("alice"))
        await asyncio.sleep(0.05)
        assert not lookup.done()  # it waits for the read under way
        go_on.set()
        assert (await lookup).locked is True and await poll is True
    finally:
        go_on.set()
        await backend.close()
