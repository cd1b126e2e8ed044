"""The move into the other stores, on what a real Synapse made: Redis for users and sessions (the dry
run and a second run leave every key byte for byte: DUMP), the LDAP directory (its users' sessions
carried, their directory passwords, Synapse's own users listed), and a store failing part-way
(no user half moved)."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest
import redis

from backends.base import StoreUnavailable, User, UserBackend
from backends.sessions.imported import ImportBatch, ImportedState
from backends.synapse.config import load_synapse_config
from backends.synapse.database import SynapseDatabase
from homeserver.cli.migrate import Progress
from homeserver.config import load_config
from homeserver.context import build_homeserver, create_backend, create_session_store
from homeserver.migration.importer import Importer
from homeserver.users import Users
from tests.migration.test_run import MOVED, line, migrate, write_config
from tests.support.synapse_before import LDAP_USER


def dump(url: str) -> dict[bytes, tuple[object, ...]]:
    """Every key: its type, its value (a hash's and a set's sorted: DUMP gives the order of a large
    hash's table, which Redis's own rehashing moves with no write), its absolute expiry, and
    DUMP for the kinds whose order is their own (strings, lists)."""
    snapshot: dict[bytes, tuple[object, ...]] = {}
    with redis.Redis.from_url(url) as client:
        for key in sorted(client.keys("*")):
            kind = client.type(key)
            value: object
            if kind == b"hash":
                value = sorted(client.hgetall(key).items())
            elif kind == b"set":
                value = sorted(client.smembers(key))
            elif kind == b"zset":
                value = client.zrange(key, 0, -1, withscores=True)
            else:
                value = client.dump(key)
            snapshot[key] = (kind, value, client.pexpiretime(key))
    return snapshot


def redis_config(folder: Path, url: str) -> Path:
    return write_config(folder, [], extra=(
        f'[backend]\ntype = "redis"\n[backend.redis]\nurl = "{url}"\n'
        f'[sessions]\nstore = "redis"\n[sessions.redis]\nurl = "{url}"\nkey_prefix = "homeserver:session:"\n'
    ))


def test_into_redis_the_dry_run_and_a_second_run_change_no_byte(tmp_path, redis_server, synapse_before):
    url = redis_server.url
    config = redis_config(tmp_path, url)
    before = dump(url)
    dry = migrate(config, synapse_before.config_path, "run", "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert dump(url) == before and dry.stderr == ""  # nothing written; no progress line on a pipe
    done = migrate(config, synapse_before.config_path, "run")
    assert done.returncode == 0, done.stdout + done.stderr
    assert line(done.stdout, "users:").startswith("users: 5 users moved (5 added to the redis user store)")
    after = dump(url)
    assert b"homeserver:user:alice" in after and b"homeserver:session:synapse:deactivated" in after
    with redis.Redis.from_url(url, decode_responses=True) as client:
        alice = client.hgetall("homeserver:user:alice")
        assert (alice["password_scheme"], alice["ident"], alice["display_name"]) == ("synapse", "", "Alice Liddell")
        assert client.hget("homeserver:user:root", "admin") == "true"
        assert client.smembers("homeserver:email:bob@example.org") == {"bob"}
    again = migrate(config, synapse_before.config_path, "run")
    assert again.returncode == 0, again.stdout + again.stderr
    assert dump(url) == after, again.stdout
    asyncio.run(_tokens_work(config, synapse_before.state))


async def _tokens_work(config_path: Path, state) -> None:
    hs = build_homeserver(load_config(str(config_path)))
    await hs.backend.start()
    await hs.sessions.store.start()
    try:
        for name, session in state.sessions.items():
            if session.user in MOVED and name != "dave":
                requester = await hs.auth.requester(session.access_token, None)
                assert (requester.user.name, requester.device_id) == (session.user, session.device_id), name
        assert await hs.login.authenticate("alice", "fish and chips", "10.0.0.1", reason="test")
    finally:
        await hs.close()


def test_into_the_ldap_directory(tmp_path, synapse_before):
    slapd = synapse_before.slapd
    config = write_config(tmp_path, [], extra=(
        f'[backend]\ntype = "ldap"\n[backend.ldap]\nuri = "{slapd.uri}"\nbase = "ou=people,dc=example,dc=org"\n'
        'mode = "bind"\n[delegation]\nadmins = ["root"]\n'
    ))
    users_file = (tmp_path / "users.json").read_bytes()
    done = migrate(config, synapse_before.config_path, "run")
    assert done.returncode == 0, done.stdout + done.stderr
    # grace came from the directory through matrix-synapse-ldap3; alice, bob, dave and erin are in
    # it too; root, Synapse's own admin, is not (listed); carol, deactivated, is recorded.
    assert line(done.stdout, "users:") == "users: 5 users moved (5 found in the directory) of 7 read"
    assert "root (missing)" in line(done.stdout, "not moved:")
    assert "warning: 1 user locked at Synapse is not locked in the LDAP directory (dave)" in done.stdout
    assert (tmp_path / "users.json").read_bytes() == users_file  # never written: the directory keeps its users
    asyncio.run(_ldap_users(config, synapse_before.state))


async def _ldap_users(config_path: Path, state) -> None:
    hs = build_homeserver(load_config(str(config_path)))
    await hs.backend.start()
    await hs.sessions.store.start()
    try:
        grace = state.sessions[LDAP_USER]
        requester = await hs.auth.requester(grace.access_token, None)
        assert (requester.user.name, requester.device_id) == (LDAP_USER, "GRACEPHONE")
        # Her password is the directory's, as it was at Synapse through matrix-synapse-ldap3.
        assert (await hs.login.authenticate(LDAP_USER, "grace-pw", "10.0.0.1", reason="test")).name == LDAP_USER
        from homeserver.errors import MatrixError

        with pytest.raises(MatrixError) as deactivated:  # carol: in the directory, deactivated at Synapse
            await hs.login.authenticate("carol", "carol-pw", "10.0.0.1", reason="test")
        assert deactivated.value.errcode == "M_USER_DEACTIVATED"
    finally:
        await hs.close()


# -- a store failing part-way ---------------------------------------------------------------------


class FailingBackend(UserBackend):
    """The real users-file backend, whose `add_users` fails from its `fail_at`th call on."""

    def __init__(self, real: UserBackend, fail_at: int) -> None:
        self.real, self.fail_at, self.calls = real, fail_at, 0

    @classmethod
    def from_config(cls, options, *, config_dir):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    async def get_user(self, name: str, *, case_insensitive: bool = False) -> User | None:
        return await self.real.get_user(name, case_insensitive=case_insensitive)

    async def get_users_by_email(self, address: str) -> list[User]:
        return await self.real.get_users_by_email(address)

    async def add_users(self, users: list[User]) -> list[str]:
        self.calls += 1
        if self.calls >= self.fail_at:
            raise StoreUnavailable("the users file's disk is full")
        return await self.real.add_users(users)


class FailingImported(ImportedState):
    """The real session store's part, whose `add` fails from its `fail_at`th call on."""

    def __init__(self, real: ImportedState, fail_at: int) -> None:
        self.real, self.fail_at, self.calls = real, fail_at, 0

    async def add(self, batch: ImportBatch) -> None:
        self.calls += 1
        if self.calls >= self.fail_at:
            raise StoreUnavailable("the session store went away")
        await self.real.add(batch)

    async def undo(self, batch: ImportBatch) -> None:
        await self.real.undo(batch)

    async def known_tokens(self, digests: list[str]) -> set[str]:
        return await self.real.known_tokens(digests)

    async def token_user(self, token_hash: str) -> str | None:
        return await self.real.token_user(token_hash)

    async def is_deactivated(self, user: str) -> bool:
        return await self.real.is_deactivated(user)

    async def deactivated_users(self) -> set[str]:
        return await self.real.deactivated_users()


@pytest.mark.parametrize("failing", ["user store", "session store"])
def test_a_store_failing_part_way_leaves_no_user_half_moved(tmp_path, synapse_before, failing):
    config_path = write_config(tmp_path, [])
    asyncio.run(_fail_then_finish(config_path, synapse_before, failing))


async def _fail_then_finish(config_path: Path, before, failing: str) -> None:
    config = load_config(str(config_path))
    synapse = load_synapse_config(str(before.config_path))
    assert synapse.database is not None
    backend, store = create_backend(config), create_session_store(config)
    await backend.start()
    await store.start()
    hs = build_homeserver(config, backend, store)
    try:
        wrapped_backend: UserBackend = FailingBackend(backend, 2) if failing == "user store" else backend
        imported = FailingImported(store.imported(), 2) if failing == "session store" else store.imported()
        importer = Importer(users=Users(wrapped_backend), backend=wrapped_backend, imported=imported,
                            credentials=hs.credentials, directory=False, batch_size=2)
        with SynapseDatabase.open(synapse.database) as database, pytest.raises(StoreUnavailable):
            await importer.run(database, synapse.server_name)
        await backend.reload()
        names = {json_user["name"] for json_user in _users(config_path)}
        # Users sorted by ID, two to a batch: the first batch (alice, bob) fully there, the rest absent.
        assert names == {"alice", "bob"}
        for name, session in before.state.sessions.items():
            works = await _works(hs, session.access_token)
            assert works == (session.user in names), (failing, name)
            assert bool(await store.devices(session.user)) == (session.user in names), (failing, name)
        # A run again completes the move.
        complete = Importer(users=Users(backend), backend=backend, imported=store.imported(),
                            credentials=hs.credentials, directory=False)
        with SynapseDatabase.open(synapse.database) as database:
            counts = await complete.run(database, synapse.server_name)
        assert counts.added == 3 and counts.kept == 2
        for name, session in before.state.sessions.items():
            assert await _works(hs, session.access_token) == (session.user in MOVED and name != "dave"), name
    finally:
        await hs.close()


def _users(config_path: Path) -> list[dict[str, object]]:
    return list(json.loads((config_path.parent / "users.json").read_text())["users"])


async def _works(hs, token: str) -> bool:
    from homeserver.errors import MatrixError

    try:
        await hs.auth.requester(token, None)
    except MatrixError:
        return False
    return True


def test_progress_rewrites_one_line_on_a_terminal_and_says_nothing_on_a_pipe():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    shown, piped = Terminal(), io.StringIO()
    for stream in (shown, piped):
        progress = Progress(stream, "migrate-synapse run")
        progress(1000, 10_000)
        progress(10_000, 10_000)
        progress.clear()
    assert shown.getvalue() == ("\rmigrate-synapse run: 1,000 of 10,000 users\rmigrate-synapse run: 10,000 of "
                                "10,000 users\r\033[K")
    assert piped.getvalue() == ""
