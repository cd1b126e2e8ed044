"""Discovery documents, versions, CORS, OPTIONS and unknown routes."""

import pytest

from tests.support.helpers import CORS, assert_error, assert_json
from tests.support.openapi import validate


async def test_well_known_client(fetch):
    resp = await fetch("/.well-known/matrix/client")
    body = assert_json(resp)
    assert body == {
        "m.homeserver": {"base_url": "http://localhost:8008"},
        "m.identity_server": {"base_url": "https://vector.im"},
    }
    validate(resp, "wellknown.yaml", "/matrix/client")


SUPPORT = {
    "server": {"base_url": "https://matrix.example.org/"},
    "support": {"email_address": "ops@example.org", "matrix_id": "@ops:example.org"},
}


@pytest.mark.parametrize("config_overrides", [{"server": {"identity_server_url": ""}}])
async def test_well_known_client_without_identity_server(fetch, config_overrides):
    body = assert_json(await fetch("/.well-known/matrix/client"))
    assert body == {"m.homeserver": {"base_url": "http://localhost:8008"}}


@pytest.mark.parametrize("config_overrides", [SUPPORT])
async def test_well_known_support_uses_config(fetch, config_overrides):
    resp = await fetch("/.well-known/matrix/support")
    body = assert_json(resp)
    assert body == {
        "contacts": [{"email_address": "ops@example.org", "matrix_id": "@ops:example.org", "role": "m.role.admin"}],
        "support_page": "https://matrix.example.org/support.html",
    }
    # The contact's fields come in the specified order: e-mail, user ID, role.
    assert list(body["contacts"][0]) == ["email_address", "matrix_id", "role"]
    validate(resp, "support.yaml", "/matrix/support")


@pytest.mark.parametrize("config_overrides", [{"support": {"email_address": "<b>x</b>@example.org"}}])
async def test_support_page_lists_contacts_as_html(fetch, config_overrides):
    resp = await fetch("/support.html")
    assert resp.status == 200, resp
    assert resp.headers["Content-Type"] == "text/html; charset=utf-8"
    assert resp.headers["Access-Control-Allow-Origin"] == "*"
    page = resp.body.decode()
    assert "&lt;b&gt;x&lt;/b&gt;@example.org" in page and "<b>x</b>" not in page
    assert "@admin:localhost" in page and "m.role.admin" in page


async def test_versions_is_exactly_v1_12(fetch):
    resp = await fetch("/_matrix/client/versions")
    assert assert_json(resp) == {"versions": ["v1.12"]}
    validate(resp, "versions.yaml", "/versions")


async def test_versions_ignores_a_token(fetch):
    assert assert_json(await fetch("/_matrix/client/versions", token="not-a-token")) == {"versions": ["v1.12"]}


@pytest.mark.parametrize(
    "path",
    [
        "/_matrix/client/versions",
        "/_matrix/client/v3/login",
        "/_matrix/client/v3/capabilities",
        "/_matrix/client/v3/account/whoami",
        "/_matrix/client/v3/profile/@alice:localhost",
        "/.well-known/matrix/client",
        "/no/such/path",
    ],
)
async def test_options_answers_204_with_cors_and_no_logic(fetch, path):
    resp = await fetch(path, "OPTIONS", headers={"Origin": "https://app.example", "Access-Control-Request-Method": "POST"})
    assert resp.status == 204, resp
    assert resp.body == b""
    for name, value in CORS.items():
        assert resp.headers[name] == value


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/_matrix/unknown",
        "/_matrix/client/unknown",
        "/_matrix/client/v1/unknown",
        "/_matrix/client/v3/room/unknown",
        "/_matrix/federation/v1/version",
        "/_matrix/client/r0/login",
        "/_matrix/client/v3/login/extra",
        "/.well-known/matrix/server",
    ],
)
@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "DELETE", "PATCH"])
async def test_unknown_paths_are_404_unrecognized(fetch, path, method, login):
    token = (await login())["access_token"]
    assert_error(await fetch(path, method, token=token), 404, "M_UNRECOGNIZED")


@pytest.mark.parametrize(
    "method, path",
    [
        ("PUT", "/_matrix/client/v3/login"),
        ("DELETE", "/_matrix/client/v3/login"),
        ("POST", "/_matrix/client/versions"),
        ("POST", "/.well-known/matrix/client"),
        ("PUT", "/_matrix/client/v3/profile/@alice:localhost"),
        ("POST", "/_matrix/client/v3/capabilities"),
        ("PATCH", "/_matrix/client/v3/account/whoami"),
    ],
)
async def test_known_path_wrong_method_is_405_unrecognized(fetch, method, path):
    assert_error(await fetch(path, method), 405, "M_UNRECOGNIZED")


async def test_unsupported_http_method_is_a_json_405(http_server_client):
    resp = await http_server_client.fetch(
        "/_matrix/client/versions", method="PROPFIND", raise_error=False, allow_nonstandard_methods=True
    )
    assert resp.code == 405
    assert resp.headers["Content-Type"] == "application/json"
    assert b"M_UNRECOGNIZED" in resp.body
