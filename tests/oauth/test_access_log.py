"""Issue 34, finding 7: no secret of the OAuth API (a code, a refresh token, a PKCE verifier, a
client secret, a login hint, a device or user code) reaches the access log when a client puts
it in a query string."""

from __future__ import annotations

import logging
from urllib.parse import unquote, urlencode

import pytest

from homeserver.logs import SECRET_PARAMS, scrub_uri

pytestmark = pytest.mark.usefixtures("io_loop")

SECRETS = {
    "refresh_token": "mhr_refresh-secret", "code": "code-secret", "code_verifier": "verifier-secret",
    "client_secret": "client-secret", "login_hint": "alice@example.org", "device_code": "mhd_device-secret",
    "user_code": "WDJB-MJHT", "id_token_hint": "id-token-secret", "client_assertion": "assertion-secret",
    "loginToken": "login-token-secret",
}


def test_every_secret_parameter_is_redacted():
    assert set(SECRETS) <= SECRET_PARAMS
    scrubbed = scrub_uri("/oauth2/token?" + urlencode({**SECRETS, "grant_type": "refresh_token", "state": "s1"}))
    for value in SECRETS.values():
        assert value not in scrubbed and urlencode({"v": value})[2:] not in scrubbed
    assert "grant_type=refresh_token" in scrubbed and "state=s1" in scrubbed


def test_a_secret_in_an_address_carried_in_the_query_is_redacted_one_level_down():
    then = "/account/device?" + urlencode({"user_code": "WDJB-MJHT", "x": "1"})
    scrubbed = scrub_uri("/account/second-step?" + urlencode({"then": then}))
    assert "WDJB" not in scrubbed and "redacted" in unquote(scrubbed) and "x%3D1" in scrubbed
    plain = "/account/second-step?" + urlencode({"then": "/account/?action=org.matrix.profile"})
    assert scrub_uri(plain) == plain
    deep = "/x?" + "then=/y?" * 5000 + "code=c0de"  # no deeper than one level: no recursion to exhaust
    assert scrub_uri(deep).startswith("/x?then=")


async def test_the_access_line_of_an_oauth_request_has_no_secret(fetch, caplog):
    caplog.set_level(logging.INFO)
    await fetch("/oauth2/token?" + urlencode(SECRETS), "POST", body="grant_type=refresh_token",
                headers={"Content-Type": "application/x-www-form-urlencoded"})
    await fetch("/account/authorize?" + urlencode({"client_id": "X", "login_hint": SECRETS["login_hint"]}))
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "/oauth2/token?" in logged and "/account/authorize?" in logged
    for value in SECRETS.values():
        assert value not in logged and urlencode({"v": value})[2:] not in logged
