"""The password asked again on the account page is checked for the signed-in user as stored,
never read as a form's name: a name with an @ inside (kept by an operator's users file as
Matrix's historical grammar allows) is not taken for an e-mail address there."""

from __future__ import annotations

import pytest

from tests.support.helpers import assert_json, record
from tests.support.page_client import Browser, assert_page

pytestmark = pytest.mark.usefixtures("io_loop")

NAME = "carol@example.org"
WHOAMI = "/_matrix/client/v3/account/whoami"


@pytest.fixture
def user_records():
    return [record(NAME, "carol-pw", "carol-ident")]


async def test_sign_out_everywhere_takes_the_password_of_a_name_with_an_at(fetch, login):
    token = (await login(NAME, "carol-pw", device_id="PHONE"))["access_token"]
    assert_json(await fetch(WHOAMI, token=token))
    browser = Browser(fetch)
    assert (await browser.sign_in(f"@{NAME}:localhost", "carol-pw")).status == 303
    resp = await browser.post({"op": "end_all", "password": "carol-pw"})
    assert resp.status == 303, assert_page(resp, resp.status)
    assert (await fetch(WHOAMI, token=token)).status == 401
