"""Issue 34, finding 7: no secret of the OAuth API (a code, a refresh token, a PKCE verifier, a
client secret, a login hint, a device or user code) reaches the access log when a client puts
it in a query string."""

from __future__ import annotations

import logging
from urllib.parse import urlencode

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


async def test_the_access_line_of_an_oauth_request_has_no_secret(fetch, caplog):
    caplog.set_level(logging.INFO)
    await fetch("/oauth2/token?" + urlencode(SECRETS), "POST", body="grant_type=refresh_token",
                headers={"Content-Type": "application/x-www-form-urlencoded"})
    await fetch("/account/authorize?" + urlencode({"client_id": "X", "login_hint": SECRETS["login_hint"]}))
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "/oauth2/token?" in logged and "/account/authorize?" in logged
    for value in SECRETS.values():
        assert value not in logged and urlencode({"v": value})[2:] not in logged
