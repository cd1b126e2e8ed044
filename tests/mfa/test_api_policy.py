"""The second factor's policy at the Matrix API (`[mfa]`, issue 38): `m.login.password` is
refused (403 M_FORBIDDEN, "sign in through the browser", no session) for a person who has or
must have a second factor, only once the password passed (a wrong password answers as for
anyone, so nobody learns who has one); device deletion's UIA sends them to the account page;
with `[mfa]` off nothing changes, factors kept in the store or not."""

from __future__ import annotations

import pytest

from tests.support.helpers import DEFAULT_USERS, assert_error, assert_json, record
from tests.support.page_client import Browser, assert_page
from tests.support.second_factors import add_app

KEY = "an operator's key of at least 32 bytes, for tests"
LOGIN = "/_matrix/client/v3/login"


def body(user: str, password: str) -> dict:
    return {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user}, "password": password}


@pytest.fixture
def user_records():
    return [dict(r) for r in DEFAULT_USERS] + [record("carol", "sesame", "-c", mfa_required=True)]


@pytest.fixture
def config_overrides():
    return {"mfa": {"enabled": True, "key": KEY}, "metrics": {"enabled": True}}


async def test_a_person_with_an_app_is_refused_the_password_login_without_a_session(hs, fetch):
    await add_app(hs.second_factors, "alice")
    resp = await fetch(LOGIN, "POST", json_body=body("alice", "wonderland"))
    error = assert_error(resp, 403, "M_FORBIDDEN")
    assert "browser" in error["error"] and "access_token" not in error
    assert await hs.devices.list_devices("alice") == []
    # bob has none: his password login goes on as ever.
    assert_json(await fetch(LOGIN, "POST", json_body=body("bob", "builder")))
    outcomes = {s.labels["outcome"]: s.value for m in hs.metrics.logins.collect() for s in m.samples
                if s.name.endswith("_total")}
    assert outcomes == {"second_factor_required": 1.0, "success": 1.0}


async def test_the_password_is_checked_first(hs, fetch):
    """A wrong password for a person with a second factor answers what it answers anyone."""
    await add_app(hs.second_factors, "alice")
    with_factor = assert_error(await fetch(LOGIN, "POST", json_body=body("alice", "nope")), 403, "M_FORBIDDEN")
    without = assert_error(await fetch(LOGIN, "POST", json_body=body("bob", "nope")), 403, "M_FORBIDDEN")
    assert with_factor == without == {"errcode": "M_FORBIDDEN", "error": "Invalid username or password"}


async def test_a_person_the_store_marks_is_refused_before_adding_one(hs, fetch):
    error = assert_error(await fetch(LOGIN, "POST", json_body=body("carol", "sesame")), 403, "M_FORBIDDEN")
    assert "second factor" in error["error"]


class TestRequiredForAll:
    @pytest.fixture
    def config_overrides(self):
        return {"mfa": {"enabled": True, "key": KEY, "required": "all"}}

    async def test_everyone_is_refused(self, fetch):
        assert_error(await fetch(LOGIN, "POST", json_body=body("bob", "builder")), 403, "M_FORBIDDEN")


async def test_device_deletion_sends_a_person_with_a_factor_to_the_account_page(hs, fetch, login):
    token = (await login("bob", "builder", device_id="BOBPHONE"))["access_token"]
    await add_app(hs.second_factors, "bob")
    resp = await fetch("/_matrix/client/v3/devices/BOBPHONE", "DELETE", json_body={}, token=token)
    error = assert_error(resp, 403, "M_FORBIDDEN")
    assert "/account/" in error["error"] and "flows" not in error
    # The session is still there: nothing ended.
    assert [d.device_id for d in await hs.devices.list_devices("bob")] == ["BOBPHONE"]


class TestOff:
    """`[mfa]` off: no part built, the key never made, factors left in the store ignored."""

    @pytest.fixture
    def config_overrides(self):
        return {}

    async def test_nothing_changes(self, hs, fetch, session_store, tmp_path):
        assert hs.second_factors is None and hs.mfa_policy is None
        assert hs.login.second_factor is None and hs.uia.second_factor is None
        assert not (tmp_path / "mfa.key").exists()
        # Factors in the store from a time it was on: not asked.
        from homeserver.config import build_config
        from homeserver.mfa.service import SecondFactors

        on = build_config({"mfa": {"enabled": True, "key": KEY}})
        await add_app(SecondFactors.from_config(on, session_store.factors(), None), "alice")
        assert_json(await fetch(LOGIN, "POST", json_body=body("alice", "wonderland")))
        for path in ("/account/security", "/account/second-step"):
            assert (await fetch(path)).status == 404
        # The account page as before: no Security in its menu, no second factor in its lists.
        browser = Browser(fetch)
        assert (await browser.sign_in("alice", "wonderland")).status == 303
        page = assert_page(await browser.get())
        assert "/account/security" not in page and "Second factor" not in page
