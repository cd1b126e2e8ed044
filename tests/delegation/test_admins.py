"""Admins from the user store (issue 36): a users-file record's `"admin": true` gives its
tokens Synapse's admin scope at introspection, as `[delegation] admins` does, and losing the
flag takes it away from the next introspection (Synapse keeps an answer two minutes; the
real Synapse's admin API is tests/delegation/test_synapse_lifecycle.py's)."""

from __future__ import annotations

from tests.delegation.test_delegation import (  # noqa: F401  (fixtures)
    config_overrides,
    delegated,
    delegation_section,
    edit_users,
    introspect,
    scope,
)


def set_admin(users_path: str, name: str, admin: bool) -> None:
    def change(users: list[dict]) -> list[dict]:
        for record in users:
            if record["name"] == name:
                record.pop("admin", None)
                if admin:
                    record["admin"] = True
        return users

    edit_users(users_path, change)


async def test_the_stores_admin_flag_gives_the_admin_scope_until_it_is_taken_away(fetch, login, hs, users_path):
    body = await login()
    token, device = body["access_token"], body["device_id"]
    assert (await introspect(fetch, token))[1]["scope"] == scope(device)
    set_admin(users_path, "alice", True)
    await hs.backend.reload()
    assert (await introspect(fetch, token))[1]["scope"] == scope(device, admin=True)
    set_admin(users_path, "alice", False)
    await hs.backend.reload()
    assert (await introspect(fetch, token))[1]["scope"] == scope(device)


async def test_the_name_list_and_the_flag_both_work(fetch, login, hs, users_path):
    # bob is in [delegation] admins (the fixture's section) and has no flag; alice the flag.
    set_admin(users_path, "alice", True)
    await hs.backend.reload()
    for name, password in (("alice", "wonderland"), ("bob", "builder")):
        body = await login(name, password)
        assert (await introspect(fetch, body["access_token"]))[1]["scope"] == scope(body["device_id"], admin=True)
