"""A user Synapse had deactivated when it moved here is refused by every password form, even
while the user store has them (the lead's decision for issues 35 and 36): 403
M_USER_DEACTIVATED, only once the password is right (a wrong one says nothing more)."""

from __future__ import annotations

import pytest

from backends.sessions.imported import ImportBatch
from homeserver.errors import MatrixError
from tests.support.helpers import assert_error, assert_json, record

LOGIN = "/_matrix/client/v3/login"


def body_for(user: str, password: str) -> dict[str, object]:
    return {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user}, "password": password}


@pytest.fixture
def user_records():
    return [record("carol", "carol-pw", email="carol@example.org"), record("alice", "wonderland")]


@pytest.fixture
def deactivated(hs, io_loop):
    io_loop.run_sync(lambda: hs.sessions.store.imported().add(ImportBatch(deactivated=["carol"])))


async def test_a_synapse_deactivated_user_cannot_log_in(fetch, deactivated, hs):
    resp = await fetch(LOGIN, "POST", json_body=body_for("carol", "carol-pw"))
    assert_error(resp, 403, "M_USER_DEACTIVATED", "This account has been deactivated")
    by_address = {"type": "m.login.password", "password": "carol-pw",
                  "identifier": {"type": "m.id.thirdparty", "medium": "email", "address": "carol@example.org"}}
    assert_error(await fetch(LOGIN, "POST", json_body=by_address), 403, "M_USER_DEACTIVATED")
    # A wrong password answers as for anyone.
    assert_error(await fetch(LOGIN, "POST", json_body=body_for("carol", "nope")), 403, "M_FORBIDDEN")
    assert_json(await fetch(LOGIN, "POST", json_body=body_for("alice", "wonderland")))
    assert await hs.sessions.store.users() == ["alice"]


async def test_the_forms_refuse_them_too(hs, deactivated):
    with pytest.raises(MatrixError) as refused:
        await hs.login.authenticate("carol", "carol-pw", "127.0.0.1", reason="account page")
    assert (refused.value.status, refused.value.errcode) == (403, "M_USER_DEACTIVATED")
