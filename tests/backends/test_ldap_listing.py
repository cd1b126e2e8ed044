"""The directory's listing on real slapd servers: paged results (RFC 2696) through a server
size limit, the limit that paging cannot pass, referrals, a directory failing part-way, and
the listing agreeing with lookups name by name (ambiguous names, second uids, several
bases, the operator's filter, lower-cased IDs, several name attributes)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import ldap3
import pytest

from backends.base import StoreIncomplete
from backends.ldap_listing import PAGE_SIZE
from homeserver.context import create_backend
from tests.support.slapd import (
    PEOPLE,
    READER_DN,
    READER_PASSWORD,
    SUFFIX,
    Slapd,
    base_ldif,
    crypt_bcrypt,
    person,
    require_slapd,
)

MANY = 3000
# A soft limit of 500 for every search, lifted for paged ones (size.prtotal): the set-up an
# OpenLDAP operator makes for paging clients. Alone, "500" binds paged searches too.
PAGED_LIMIT = "size.soft=500 size.prtotal=unlimited"


def many_ldif(extra: tuple[str, ...] = ()) -> str:
    password = crypt_bcrypt("many-pw")  # one hash for all: the listing never checks them
    people = (person(f"user{i:05d}", displayName=f"User {i}", userPassword=password) for i in range(MANY))
    return "\n".join([base_ldif(), *people, *extra])


@pytest.fixture(scope="module")
def paged_slapd() -> Iterator[Slapd]:
    """MANY people behind a soft size limit of 500 that paged searches may pass."""
    require_slapd()
    server = Slapd(many_ldif(), tls=False, size_limit=PAGED_LIMIT)
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


def options(server: Slapd, **extra: Any) -> dict[str, dict[str, Any]]:
    section = {"uri": server.uri, "base": SUFFIX, "bind_dn": READER_DN, "bind_password": READER_PASSWORD,
               "timeout": 2.0}
    attributes = extra.pop("attributes", {})
    return {"backend": {"type": "ldap"}, "backend.ldap": {**section, **extra}, "backend.ldap.attributes": attributes}


@pytest.fixture
def open_backend(make_config, io_loop):
    """await open_backend(config_overrides) -> a started LDAP backend, closed after the test."""
    opened = []

    async def open_(overrides: dict[str, dict[str, Any]]) -> Any:
        backend = create_backend(make_config(overrides))
        opened.append(backend)
        await backend.start()
        return backend

    yield open_
    for backend in opened:
        io_loop.run_sync(backend.close)


@pytest.fixture
def private_slapd():
    """private_slapd(ldif, size_limit) -> a private slapd for this test, stopped after it."""
    servers = []

    def start(ldif: str, size_limit: str = "") -> Slapd:
        require_slapd()
        server = Slapd(ldif, tls=False, size_limit=size_limit)
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.cleanup()


def reader_search_count(server: Slapd) -> tuple[int, str]:
    """What a plain (unpaged) search by the service account gets: entries, result."""
    conn = ldap3.Connection(ldap3.Server("127.0.0.1", port=server.port, get_info=ldap3.NONE), READER_DN,
                            READER_PASSWORD, auto_bind=True, check_names=False)
    conn.search(SUFFIX, "(uid=*)", attributes=["uid"])
    count, result = len([r for r in conn.response if r["type"] == "searchResEntry"]), conn.result["description"]
    conn.unbind()
    return count, result


async def test_paged_results_read_a_directory_past_its_size_limit(paged_slapd, open_backend):
    # The limit is real: a plain search stops at 500.
    assert reader_search_count(paged_slapd) == (500, "sizeLimitExceeded")
    backend = await open_backend(options(paged_slapd))
    users = await backend.list_users()
    assert sorted(user.name for user in users) == [f"user{i:05d}" for i in range(MANY)]
    assert {user.display_name for user in users} == {f"User {i}" for i in range(MANY)}
    assert all(user.ident and user.password for user in users)


async def test_a_size_limit_paging_cannot_pass_makes_the_listing_incomplete(private_slapd, open_backend):
    backend = await open_backend(options(private_slapd(many_ldif(), "500")))
    with pytest.raises(StoreIncomplete, match="size limit") as raised:
        await backend.list_users()
    # What was read before the limit is there to use, and sound.
    assert len(raised.value.users) == 500
    assert all(user.name.startswith("user") for user in raised.value.users)


async def test_a_lookup_during_a_listing_waits_one_page_not_the_listing(paged_slapd, open_backend):
    backend = await open_backend(options(paged_slapd, pool_size=1))
    listing = asyncio.ensure_future(backend.list_users())
    await asyncio.sleep(0)
    user = await backend.get_user("user02999")
    assert user is not None and user.name == "user02999"
    assert not listing.done()  # one thread, several pages to go: the lookup got in between
    assert len(await listing) == MANY


@pytest.mark.parametrize("fault", ["kill", "pause"])
async def test_a_directory_failing_part_way_makes_the_listing_incomplete(private_slapd, open_backend, monkeypatch,
                                                                        fault):
    server = private_slapd(many_ldif(), PAGED_LIMIT)
    backend = await open_backend(options(server, timeout=1.0))
    run, pages = backend.pool.run, []

    async def first_page_then_fault(fn, *args, **kwargs):
        result = await run(fn, *args, **kwargs)
        if getattr(fn, "__name__", "") == "_page":
            pages.append(result)
            if len(pages) == 1:
                server.kill() if fault == "kill" else server.pause()
        return result

    monkeypatch.setattr(backend.pool, "run", first_page_then_fault)
    with pytest.raises(StoreIncomplete, match="failed after 500 entries") as raised:
        await backend.list_users()
    assert len(raised.value.users) == PAGE_SIZE


def established_to(port: int) -> int:
    """This machine's open TCP connections to 127.0.0.1:`port` (the client ends, read from
    /proc/net/tcp): the connections the backend holds to a private slapd."""
    with open("/proc/net/tcp") as fh:
        rows = [line.split() for line in fh.readlines()[1:]]
    return sum(1 for row in rows if row[2] == f"0100007F:{port:04X}" and row[3] == "01")


async def test_a_listing_that_gave_up_on_a_slow_directory_leaves_no_connection_open(private_slapd, open_backend):
    # The directory answers the listing's bind after the listing stopped waiting (timeout
    # 1.05 s; ldap3's own receive timeout is a whole 2 s): a hang that ends, sweep after sweep.
    server = private_slapd(small_ldif())
    backend = await open_backend(options(server, timeout=1.05, pool_size=1))
    held = established_to(server.port)
    assert held == 1  # the pool thread's service connection (the start-up probe)
    for _ in range(3):
        server.pause()
        with pytest.raises(StoreIncomplete, match="cannot be listed"):
            await backend.list_users()
        server.resume()
        await backend.pool.run(lambda deadline: None)  # one thread: the abandoned job has ended
    assert established_to(server.port) == held
    assert [user.name for user in await backend.list_users()] == ["ann"]
    await backend.pool.run(lambda deadline: None)  # release closes on the pool's thread
    assert established_to(server.port) == held


async def test_a_listing_cut_short_part_way_leaves_no_connection_open(private_slapd, open_backend, monkeypatch):
    # The directory stops answering after the first page, past the listing's timeout, then
    # answers again: the listing's own connection is closed, sweep after sweep.
    server = private_slapd(many_ldif(), PAGED_LIMIT)
    backend = await open_backend(options(server, timeout=1.05, pool_size=1))
    held = established_to(server.port)
    run = backend.pool.run

    async def first_page_then_hang(fn, *args, **kwargs):
        result = await run(fn, *args, **kwargs)
        if getattr(fn, "__name__", "") == "_page":
            server.pause()
        return result

    monkeypatch.setattr(backend.pool, "run", first_page_then_hang)
    for _ in range(3):
        with pytest.raises(StoreIncomplete, match="failed after 500 entries"):
            await backend.list_users()
        server.resume()
        await run(lambda deadline: None)  # one thread: the abandoned page and the release have run
    assert established_to(server.port) == held


def referral(dn_value: str, url: str) -> str:
    rdn = dn_value.split(",", 1)[0]
    kind, _, value = rdn.partition("=")
    return f"dn: {dn_value}\nobjectClass: referral\nobjectClass: extensibleObject\n{kind}: {value}\nref: {url}\n"


REMOTE = referral(f"ou=remote,{SUFFIX}", f"ldap://ldap.elsewhere.example/ou=remote,{SUFFIX}")
# What a subtree search from an Active Directory domain's root meets: its application partitions.
AD_PARTITIONS = (
    referral(f"dc=DomainDnsZones,{SUFFIX}", f"ldap://DomainDnsZones.example.org/DC=DomainDnsZones,{SUFFIX}"),
    referral(f"dc=ForestDnsZones,{SUFFIX}", f"ldap://ForestDnsZones.example.org/DC=ForestDnsZones,{SUFFIX}"),
    referral(f"cn=Configuration,{SUFFIX}", f"ldap://example.org/CN=Configuration,{SUFFIX}"),
)


def small_ldif(*extra: str) -> str:
    return "\n".join([base_ldif(), person("ann", userPassword=crypt_bcrypt("ann-pw")), *extra])


async def test_a_referral_makes_the_listing_incomplete(private_slapd, open_backend):
    backend = await open_backend(options(private_slapd(small_ldif(REMOTE))))
    with pytest.raises(StoreIncomplete, match="referrals") as raised:
        await backend.list_users()
    assert "ldap://ldap.elsewhere.example/" in str(raised.value)
    assert [user.name for user in raised.value.users] == ["ann"]


@pytest.mark.parametrize("active_directory", [True, False])
async def test_active_directorys_partitions_are_no_referral_to_users(private_slapd, open_backend, active_directory):
    backend = await open_backend(options(private_slapd(small_ldif(*AD_PARTITIONS)), active_directory=active_directory))
    if active_directory:
        assert [user.name for user in await backend.list_users()] == ["ann"]
    else:
        with pytest.raises(StoreIncomplete, match="DomainDnsZones"):
            await backend.list_users()


async def test_a_base_that_is_a_referral_makes_the_listing_incomplete(private_slapd, open_backend):
    backend = await open_backend(options(private_slapd(small_ldif(REMOTE)), base=[PEOPLE, f"ou=remote,{SUFFIX}"]))
    with pytest.raises(StoreIncomplete, match=r"ldap://ldap\.elsewhere\.example/"):
        await backend.list_users()


# The shared test directory (tests/support/slapd.py): every uid and mail value in it.
CANDIDATES = [
    "alice", "bob", "carol", "dave", "erin", "mallory", "twin", "star*", "frank", "franky", "grace", "dup1", "dup2",
    "hwin", "ivan", "Judy", "bob@example.org", "carol@example.org", "Grace.Hopper@Example.ORG", "shared@example.org",
    "Hal.Win@example.org", "ivan@example.org",
]


@pytest.mark.parametrize("extra", [
    {},
    {"base": [PEOPLE, f"ou=staff,{SUFFIX}"]},
    {"base": [f"ou=staff,{SUFFIX}", PEOPLE]},
    {"filter": "(!(employeeType=disabled))"},
    {"lowercase_user_ids": True},
    {"attributes": {"name": ["uid", "mail"]}},
    {"mode": "bind"},
], ids=["one-base", "two-bases", "two-bases-reversed", "filter", "lowercase", "uid-or-mail", "bind-mode"])
async def test_the_listing_has_exactly_the_users_lookups_find(slapd, open_backend, extra):
    backend = await open_backend(options(slapd, **extra))
    listed = {user.name: user for user in await backend.list_users()}
    found = {}
    for candidate in CANDIDATES:
        user = await backend.get_user(candidate)
        if user is not None:
            found.setdefault(user.name, user)
    assert set(listed) == set(found)
    for name, user in listed.items():
        assert user == await backend.get_user(name)
    if "base" not in extra:
        assert "twin" not in listed  # two entries hold it: logins refuse it, the listing leaves it out
    if "attributes" not in extra:
        assert listed["franky"].dn == listed["frank"].dn  # a second uid is a second name


async def test_an_entry_without_an_ident_is_named_and_the_rest_listed(slapd, open_backend):
    backend = await open_backend(options(slapd, attributes={"ident": "employeeNumber"}))
    with pytest.raises(StoreIncomplete, match="no value for ident") as raised:
        await backend.list_users()
    # alice alone has an employeeNumber in the shared directory.
    assert [user.name for user in raised.value.users] == ["alice"]
    assert "bob" in raised.value.unreadable and "alice" not in raised.value.unreadable
