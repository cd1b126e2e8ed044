"""The directory's lifecycle at a real Synapse (issue 36), with this server (`run.py`) on a real
slapd (memberof overlay), a real Redis, or the users file (tests/support/lifecycle_stack.py):

- a colleague who never logged in is found by another's `user_directory/search`;
- a user taken out of the store is signed out here and deactivated at Synapse, and put back,
  reactivated (each store);
- most of the directory gone at once deactivates no one, until an operator confirms;
- `admin_filter` makes a group's member a Synapse admin, and leaving the group takes it away.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import ldap3
import pytest

from tests.backends.listing_stores import GROUPS, add_group, admin_connection
from tests.support.delegation_stack import SECRET, SERVER_NAME
from tests.support.helpers import ci, hex_hash
from tests.support.lifecycle_stack import ADMIN, PASSWORD, LifecycleStack, file_record, wait_for
from tests.support.redis_servers import make_store, redis_url  # noqa: F401  (fixture)
from tests.support.slapd import PEOPLE, READER_DN, READER_PASSWORD, SUFFIX, Slapd, base_ldif, require_slapd
from tests.support.synapse import SynapseUnavailable

ADMINS_GROUP = f"cn=matrix-admins,{GROUPS}"
ASSERT_ADMIN = "/_synapse/admin/v2/users?guests=false&limit=1"  # any admin call: 200 for admins, 403 else


@pytest.fixture(scope="module")
def lifecycle_synapse(tmp_path_factory) -> Iterator[LifecycleStack]:
    try:
        stack = LifecycleStack(tmp_path_factory.mktemp("lifecycle"))
    except SynapseUnavailable as exc:
        if ci():
            pytest.fail(f"{exc} (CI is set: the Synapse tests must run)")
        pytest.skip(str(exc))
    yield stack
    stack.stop()


# -- the stores ----------------------------------------------------------------------------


def entry(uid: str, display_name: str) -> dict[str, Any]:
    crypt = "{CRYPT}" + bytes.fromhex(hex_hash(PASSWORD)).decode()
    return {"uid": uid, "cn": display_name, "sn": uid, "displayName": display_name, "userPassword": crypt}


class Directory:
    """A slapd of the test's own with ou=groups and the memberof overlay; people added online."""

    def __init__(self) -> None:
        require_slapd()
        self.server = Slapd(base_ldif() + f"\ndn: {GROUPS}\nobjectClass: organizationalUnit\nou: groups\n",
                            tls=False, memberof=True)
        self.server.start()
        self.admin: ldap3.Connection = admin_connection(self.server)

    def add(self, uid: str, display_name: str) -> None:
        self.admin.add(f"uid={uid},{PEOPLE}", ["inetOrgPerson"], entry(uid, display_name))

    def remove(self, uid: str) -> None:
        self.admin.delete(f"uid={uid},{PEOPLE}")

    def config(self) -> str:
        return (
            f'[backend]\ntype = "ldap"\n[backend.ldap]\nuri = "{self.server.uri}"\nbase = "{SUFFIX}"\n'
            f'bind_dn = "{READER_DN}"\nbind_password = "{READER_PASSWORD}"\ntimeout = 2.0\n'
            f'ident_template = " ({{ident}})"\nadmin_filter = "(memberOf={ADMINS_GROUP})"\n'
            '[backend.ldap.attributes]\nident = "uid"\n'
        )

    def close(self) -> None:
        self.admin.unbind()
        self.server.cleanup()


@pytest.fixture
def directory_slapd() -> Iterator[Directory]:
    directory = Directory()
    yield directory
    directory.close()


class Store:
    """One of the three user stores, as a test changes it from outside this server."""

    def __init__(self, kind: str, request: pytest.FixtureRequest, stack: LifecycleStack) -> None:
        self.kind = kind
        self.people: dict[str, str] = {}
        self.directory: Directory | None = None
        if kind == "ldap":
            self.directory = Directory()
            request.addfinalizer(self.directory.close)
        elif kind == "redis":
            self.redis = make_store(request.getfixturevalue("redis_url"))
            request.addfinalizer(self.redis.client.close)
        self.stack = stack

    def add(self, name: str, display_name: str) -> None:
        self.people[name] = display_name
        if self.directory is not None:
            self.directory.add(name, display_name)
        elif self.kind == "redis":
            self.redis.put_record(file_record(name, display_name))
        elif self.stack.homeserver is not None:
            self._write_file()

    def remove(self, name: str) -> None:
        del self.people[name]
        if self.directory is not None:
            self.directory.remove(name)
        elif self.kind == "redis":
            self.redis.client.delete(self.redis.prefix + name)
        else:
            self._write_file()

    def _write_file(self) -> None:
        assert self.stack.homeserver is not None
        records = [file_record(name, display) for name, display in self.people.items()]
        (self.stack.homeserver.folder / "users.json").write_text(json.dumps({"users": records}))

    def serve(self) -> None:
        if self.directory is not None:
            self.stack.serve(self.directory.config())
        elif self.kind == "redis":
            self.stack.serve(f'[backend]\ntype = "redis"\n[backend.redis]\nurl = "{self.redis.url}"\n'
                             f'key_prefix = "{self.redis.prefix}"\nemail_key_prefix = "{self.redis.email_prefix}"\n')
        else:
            self.stack.serve("", [file_record(name, display) for name, display in self.people.items()])


# -- the tests -----------------------------------------------------------------------------


def test_a_colleague_who_never_logged_in_is_found_in_the_user_directory(lifecycle_synapse, directory_slapd):
    stack, directory = lifecycle_synapse, directory_slapd
    directory.add(ADMIN, "Administrator")
    directory.add("dirsearcher", "Searching Sam")
    directory.add("dirnewcomer", "Newcomer Nadia")
    stack.serve(directory.config())
    token = stack.login("dirsearcher")["access_token"]
    wait_for(lambda: stack.synapse_user("dirnewcomer"), "the newcomer provisioned by a sweep")
    status, found = stack.at_synapse("/_matrix/client/v3/user_directory/search",
                                     {"search_term": "Nadia", "limit": 10}, token)
    assert status == 200, found
    assert found["results"] == [{"user_id": f"@dirnewcomer:{SERVER_NAME}", "display_name": "Newcomer Nadia (dirnewcomer)",
                                 "avatar_url": None}], found


@pytest.mark.parametrize("kind", ["file", "redis", "ldap"])
def test_a_leaver_is_signed_out_and_deactivated_and_a_returner_reactivated(kind, request, lifecycle_synapse):
    store = Store(kind, request, lifecycle_synapse)
    stack = store.stack
    leaver, colleague = f"{kind}leaver", f"{kind}colleague"
    store.add(ADMIN, "Administrator")
    store.add(leaver, "Leaving Lee")
    store.add(colleague, "Staying Sue")
    store.serve()
    login = stack.login(leaver)
    assert stack.at_synapse("/_matrix/client/v3/account/whoami", token=login["access_token"])[0] == 200
    assert stack.deactivated(leaver) is False

    store.remove(leaver)
    wait_for(lambda: stack.deactivated(leaver), f"{leaver} deactivated at Synapse")
    assert stack.homeserver is not None and stack.homeserver.run_py("sessions", "list", leaver).stdout == ""
    status, body = stack.at_synapse("/_matrix/client/v3/account/whoami", token=login["access_token"])
    assert (status, body["errcode"]) == (401, "M_UNKNOWN_TOKEN"), body
    assert stack.deactivated(colleague) is False

    store.add(leaver, "Leaving Lee")
    wait_for(lambda: stack.deactivated(leaver) is False, f"{leaver} reactivated at Synapse")
    login = stack.login(leaver)
    status, body = stack.at_synapse("/_matrix/client/v3/account/whoami", token=login["access_token"])
    assert status == 200 and body["user_id"] == f"@{leaver}:{SERVER_NAME}", body
    # Reactivated and provisioned again: the profile is the store's, and the user directory has them.
    status, found = stack.at_synapse("/_matrix/client/v3/user_directory/search", {"search_term": "Leaving Lee"},
                                     stack.login(colleague)["access_token"])
    assert status == 200 and f"@{leaver}:{SERVER_NAME}" in [r["user_id"] for r in found["results"]], found


def test_most_of_the_directory_gone_at_once_deactivates_no_one(lifecycle_synapse, directory_slapd):
    stack, directory = lifecycle_synapse, directory_slapd
    directory.add(ADMIN, "Administrator")
    staff = [f"guard{n}" for n in range(9)]
    for name in staff:
        directory.add(name, name.title())
    stack.serve(directory.config())
    token = stack.login("guard0")["access_token"]
    wait_for(lambda: all(stack.synapse_user(name) for name in staff), "everyone provisioned")
    gone = staff[:7]
    for name in gone:
        directory.remove(name)
    assert stack.homeserver is not None
    wait_for(lambda: stack.sweeps_logged("deactivated no one at Synapse: it found 3 users, fewer than half of "
                                         "the 10") >= 2, "two sweeps held back by the guard")
    assert [name for name in staff if stack.deactivated(name)] == []
    # The store is the truth for sessions: guard0's ended here and at Synapse all the same.
    status, body = stack.at_synapse("/_matrix/client/v3/account/whoami", token=token)
    assert (status, body["errcode"]) == (401, "M_UNKNOWN_TOKEN"), body
    # The operator confirms: the next sweep deactivates them.
    done = stack.homeserver.run_py("delegation", "sync", "--all", "--allow-deactivations")
    assert done.returncode == 0, done.stderr
    assert [name for name in staff if stack.deactivated(name)] == gone, done.stdout


def test_admin_filter_makes_a_synapse_admin_and_leaving_the_group_takes_it_away(lifecycle_synapse, directory_slapd):
    stack, directory = lifecycle_synapse, directory_slapd
    directory.add(ADMIN, "Administrator")
    directory.add("groupboss", "Boss Betty")
    add_group(directory.admin, ADMINS_GROUP, [ADMIN, "groupboss"])  # a groupOfNames keeps one member
    stack.serve(directory.config())
    token = stack.login("groupboss")["access_token"]
    status, body = stack.at_synapse(ASSERT_ADMIN, token=token)
    assert status == 200, body
    directory.admin.modify(ADMINS_GROUP, {"member": [(ldap3.MODIFY_DELETE, [f"uid=groupboss,{PEOPLE}"])]})
    # Here at once: the next introspection of the same token has no admin scope.
    assert stack.homeserver is not None
    status, answer = introspect(stack.homeserver.url, token)
    assert status == 200 and "urn:synapse:admin:*" not in answer["scope"], answer
    # A new token of hers is no admin at Synapse at once; the one Synapse has kept an answer
    # for, once that answer is two minutes old.
    fresh = stack.login("groupboss")["access_token"]
    assert stack.at_synapse(ASSERT_ADMIN, token=fresh)[0] == 403
    started = time.monotonic()
    wait_for(lambda: stack.at_synapse(ASSERT_ADMIN, token=token)[0] == 403, "the admin scope gone at Synapse",
             timeout=150, every=5)
    assert time.monotonic() - started <= 130


def introspect(url: str, token: str) -> tuple[int, Any]:
    request = urllib.request.Request(
        url + "/oauth2/introspect", data=urllib.parse.urlencode({"token": token}).encode(),
        headers={"Authorization": f"Bearer {SECRET}", "Content-Type": "application/x-www-form-urlencoded"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        return resp.status, json.loads(resp.read())
