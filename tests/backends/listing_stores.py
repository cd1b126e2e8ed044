"""One set of users in each of the three stores (the users file, Redis, a real slapd), for
the tests of the whole-store listing and the admin / second-factor flags.

alice is an admin, bob is locked, carol must have a second factor, dave is plain. In the
directory the flags come from `admin_filter` and `mfa_required_filter` on groups (memberOf,
kept by slapd's memberof overlay) and `locked_filter` on an attribute, the way operators
set them; ident is `employeeNumber`, so a store's ident is the same in all three.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import ldap3

from tests.support.helpers import hex_hash, record
from tests.support.redis_servers import RedisProcess, make_store, redis_overrides, start_server
from tests.support.slapd import PEOPLE, READER_DN, READER_PASSWORD, SUFFIX, Slapd, base_ldif, person, require_slapd

ADMIN_DN, ADMIN_PASSWORD = f"cn=admin,{SUFFIX}", "adminpw"
GROUPS = f"ou=groups,{SUFFIX}"
ADMINS_GROUP = f"cn=matrix-admins,{GROUPS}"
STAFF_GROUP = f"cn=staff,{GROUPS}"

RECORDS = [
    record("alice", ident="alice-id", display_name="Alice", avatar_url="mxc://localhost/alice",
           email="alice@example.org", admin=True),
    record("bob", ident="bob-id", locked=True),
    record("carol", ident="carol-id", display_name="Carol", email="Carol@Example.org", mfa_required=True),
    record("dave", ident="dave-id"),
]
NAMES = {"alice", "bob", "carol", "dave"}

# The directory's side of the same users, and the filters that give the flags.
LDAP_OPTIONS = {
    "admin_filter": f"(memberOf={ADMINS_GROUP})",
    # Written with spaces after the commas: DNs compare without them.
    "mfa_required_filter": f"(memberOf=cn=staff, ou=groups, {SUFFIX})",
    "locked_filter": "(employeeType=locked)",
}
LDAP_ATTRIBUTES = {"ident": "employeeNumber"}


def redis_fields(rec: dict[str, Any]) -> dict[str, Any]:
    """A users-file record as a Redis hash holds it: flags as "true"."""
    return {key: "true" if value is True else value for key, value in rec.items()}


def crypt(password: str) -> str:
    return "{CRYPT}" + bytes.fromhex(hex_hash(password)).decode()


def ldap_people() -> dict[str, dict[str, str]]:
    """The directory's entries of RECORDS' users, by uid: their attributes (cn and sn are the uid)."""
    return {
        "alice": dict(displayName="Alice", labeledURI="mxc://localhost/alice", mail="alice@example.org",
                      employeeNumber="alice-id", userPassword=crypt("secret")),
        "bob": dict(employeeType="locked", employeeNumber="bob-id", userPassword=crypt("secret")),
        "carol": dict(displayName="Carol", mail="Carol@Example.org", employeeNumber="carol-id",
                      userPassword=crypt("secret")),
        "dave": dict(employeeNumber="dave-id", userPassword=crypt("secret")),
    }


def directory_ldif(extra: tuple[str, ...] = ()) -> str:
    return "\n".join([
        base_ldif(),
        f"dn: {GROUPS}\nobjectClass: organizationalUnit\nou: groups\n",
        *(person(uid, **attributes) for uid, attributes in ldap_people().items()),
        *extra,
    ])


def admin_connection(server: Slapd) -> ldap3.Connection:
    """The directory's administrator, changing entries as an operator's tools would."""
    return ldap3.Connection(
        ldap3.Server("127.0.0.1", port=server.port, get_info=ldap3.NONE), ADMIN_DN, ADMIN_PASSWORD,
        auto_bind=True, raise_exceptions=True, check_names=False,
    )


def add_group(conn: ldap3.Connection, dn: str, members: list[str]) -> None:
    """A groupOfNames added online, so the memberof overlay writes the members' memberOf."""
    conn.add(dn, ["groupOfNames"], {"member": [f"uid={uid},{PEOPLE}" for uid in members]})


@dataclass
class ListedStore:
    """One store holding RECORDS, and what a test does to it from outside the backend."""

    kind: str
    overrides: dict[str, dict[str, Any]]
    remove: Callable[[str], None]  # take a user out of the store
    restore: Callable[[str], None]  # put a user of RECORDS back as it was (in LDAP: no group)
    break_record: Callable[[str], None]  # make a user's record malformed
    stop: Callable[[], None]  # make the store unreachable
    close: list[Callable[[], None]] = field(default_factory=list)
    server: Slapd | None = None  # the directory's slapd and its administrator's connection
    admin: ldap3.Connection | None = None


def file_store(tmp_path: Any) -> ListedStore:
    path = tmp_path / "listed-users.json"
    path.write_text(json.dumps({"users": RECORDS}))
    path.chmod(0o600)

    def edit(change: Callable[[list[dict[str, Any]]], None]) -> None:
        users = json.loads(path.read_text())["users"]
        change(users)
        path.write_text(json.dumps({"users": users}))

    def remove(name: str) -> None:
        edit(lambda users: users.remove(next(u for u in users if u["name"] == name)))

    def restore(name: str) -> None:
        edit(lambda users: users.append(next(dict(r) for r in RECORDS if r["name"] == name)))

    def break_record(name: str) -> None:
        edit(lambda users: next(u for u in users if u["name"] == name).pop("ident"))

    # reload_interval 0: no poller, so the listing alone must see the file change.
    overrides = {"backend": {"type": "file"}, "backend.file": {"path": str(path), "reload_interval": 0}}
    return ListedStore("file", overrides, remove, restore, break_record, lambda: os.remove(path))


def redis_store(tmp_path: Any, start: Callable[[str], RedisProcess]) -> ListedStore:
    server = start(str(tmp_path / "redis"))
    store = make_store(server.url)
    for rec in RECORDS:
        store.put_record(redis_fields(rec))
    listed = ListedStore(
        "redis", redis_overrides(store), lambda name: store.client.delete(store.prefix + name),
        lambda name: store.put_record(redis_fields(next(r for r in RECORDS if r["name"] == name))),
        lambda name: store.client.hdel(store.prefix + name, "ident"), server.stop,
    )
    listed.close += [store.client.close, server.stop]
    return listed


def ldap_store() -> Iterator[ListedStore]:
    require_slapd()
    server = Slapd(directory_ldif(), tls=False, memberof=True)
    try:
        server.start()
        admin = admin_connection(server)
        add_group(admin, ADMINS_GROUP, ["alice"])
        add_group(admin, STAFF_GROUP, ["carol"])
        overrides = {
            "backend": {"type": "ldap"},
            "backend.ldap": {
                "uri": server.uri, "base": SUFFIX, "bind_dn": READER_DN, "bind_password": READER_PASSWORD,
                "timeout": 2.0, **LDAP_OPTIONS,
            },
            "backend.ldap.attributes": LDAP_ATTRIBUTES,
        }
        listed = ListedStore(
            "ldap", overrides, lambda name: admin.delete(f"uid={name},{PEOPLE}"),
            lambda name: admin.add(f"uid={name},{PEOPLE}", ["inetOrgPerson"],
                                   {"uid": name, "cn": name, "sn": name, **ldap_people()[name]}),
            lambda name: admin.modify(f"uid={name},{PEOPLE}", {"employeeNumber": [(ldap3.MODIFY_DELETE, [])]}),
            server.stop,
        )
        listed.server, listed.admin = server, admin
        listed.close.append(admin.unbind)
        yield listed
    finally:
        server.cleanup()


def listed_store(kind: str, tmp_path: Any) -> Iterator[ListedStore]:
    """The store of `kind` ("file", "redis", "ldap") for one test (a fixture's body), closed after it."""
    if kind == "file":
        yield file_store(tmp_path)
        return
    for listed in [redis_store(tmp_path, start_server)] if kind == "redis" else ldap_store():
        yield listed
        for close in listed.close:
            close()
