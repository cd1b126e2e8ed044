"""A link cannot make the account page claim what did not happen: a form's outcome travels in
a short-lived signed cookie read once, never in the URL."""

from __future__ import annotations

import pytest

from tests.support.page_client import assert_page, set_cookies

pytestmark = pytest.mark.usefixtures("io_loop")

EVERYWHERE = "Every session of your account has ended"
APPROVED = "For the next 10 minutes your Matrix client may reset"
RESET = "org.matrix.cross_signing_reset"


async def test_crafted_notices_claim_nothing(browser):
    for query in ({"notice": "signed_out_everywhere"}, {"notice": "signed_out"}, {"notice": "ended"}):
        body = assert_page(await browser.get(query))
        assert 'class="notice"' not in body, query
    assert (await browser.sign_in()).status == 303
    for notice in ("signed_out_everywhere", "ended", "ended_others", "renamed", "reset_allowed"):
        body = assert_page(await browser.get({"notice": notice}))
        assert 'class="notice"' not in body, notice


async def test_a_crafted_reset_link_shows_the_approval_form(browser, fake_synapse):
    assert (await browser.sign_in()).status == 303
    body = assert_page(await browser.get({"action": RESET, "notice": "reset_allowed"}))
    assert APPROVED not in body and "Approved." not in body
    assert 'value="reset"' in body  # the form, not "go back to your client"
    assert fake_synapse.received == []


async def test_the_real_outcome_is_shown_once(browser, fake_synapse):
    assert (await browser.sign_in()).status == 303
    resp = await browser.post({"op": "reset", "password": "wonderland"})
    assert resp.headers["Location"] == "/account/?action=" + RESET  # nothing in the URL
    flash = set_cookies(resp)["hs_flash"]
    assert flash["httponly"] and flash["samesite"] == "Strict" and flash["max-age"] == "60"
    body = assert_page(await browser.follow(resp))
    assert APPROVED in body and 'value="reset"' not in body
    body = assert_page(await browser.get({"action": RESET}))  # read once
    assert APPROVED not in body and 'value="reset"' in body


async def test_signing_out_everywhere_says_so_once(browser, login):
    await login()
    assert (await browser.sign_in()).status == 303
    resp = await browser.post({"op": "end_all", "password": "wonderland"})
    assert EVERYWHERE in assert_page(await browser.follow(resp))
    assert EVERYWHERE not in assert_page(await browser.get())


async def test_a_forged_flash_cookie_is_ignored(browser):
    assert (await browser.sign_in()).status == 303
    browser.cookies["hs_flash"] = "signed_out_everywhere"
    body = assert_page(await browser.get())
    assert 'class="notice"' not in body
    assert "hs_flash" not in browser.cookies  # cleared all the same
