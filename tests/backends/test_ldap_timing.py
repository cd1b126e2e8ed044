"""With LDAP in bind mode the directory checks passwords: an unknown name must cost what a
wrong password costs there (a bind), not a bcrypt check the known names never pay, or the
time of a refusal tells which names do not exist (the reverse of the users file's leak).
Compared as medians over interleaved tries (a ratio), as tests/handlers/test_login_timing.py."""

from __future__ import annotations

from typing import Any

import pytest

from tests.handlers.test_login_timing import ratio
from tests.support.helpers import assert_error
from tests.support.page_client import Browser
from tests.support.slapd import READER_DN, READER_PASSWORD, SUFFIX

pytestmark = pytest.mark.usefixtures("io_loop")

# A stand-in bcrypt check at this cost (~15-60 ms) would dwarf a bind (~1-3 ms).
ROUNDS = 8


@pytest.fixture
def config_overrides(slapd) -> dict[str, dict[str, Any]]:
    return {
        "auth": {"bcrypt_rounds": ROUNDS},
        "backend": {"type": "ldap"},
        "backend.ldap": {
            "uri": slapd.uri, "base": SUFFIX, "bind_dn": READER_DN, "bind_password": READER_PASSWORD,
            "timeout": 2.0, "mode": "bind",
        },
    }


@pytest.fixture
def fetch(fetch, app):
    return fetch


async def test_an_unknown_name_costs_a_bind_on_the_api(fetch):
    # dave's directory password is a salted SHA-1: the directory's own check is cheap.
    async def attempt(name: str) -> None:
        body = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": name}, "password": "wrong"}
        assert_error(await fetch("/_matrix/client/v3/login", "POST", json_body=body), 403, "M_FORBIDDEN")

    async def known_is(name: str) -> None:
        await attempt("dave" if name == "alice" else name)

    assert 0.5 < await ratio(known_is) < 2.0


async def test_an_unknown_name_costs_a_bind_on_the_page(fetch):
    browser = Browser(fetch)

    async def attempt(name: str) -> None:
        assert (await browser.sign_in("dave" if name == "alice" else name, "wrong")).status == 403

    assert 0.5 < await ratio(attempt) < 2.0


async def test_an_unknown_address_costs_a_bind(fetch):
    async def attempt(name: str) -> None:
        address = "dave-nobody@example.org" if name == "nobody" else "bob@example.org"
        body = {"type": "m.login.password", "password": "wrong",
                "identifier": {"type": "m.id.thirdparty", "medium": "email", "address": address}}
        assert_error(await fetch("/_matrix/client/v3/login", "POST", json_body=body), 403, "M_FORBIDDEN")

    assert 0.5 < await ratio(attempt) < 2.0
