"""Prometheus metrics: scraped from /metrics after some traffic."""

from __future__ import annotations

import re

import pytest

from homeserver.app import make_app, make_metrics_app
from homeserver.context import build_homeserver
from homeserver.errors import StoreUnavailable
from tests.support.helpers import assert_error, assert_json

LOGIN = "/_matrix/client/v3/login"


def body(user: str = "alice", password: str = "wonderland") -> dict:
    return {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user}, "password": password}


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample in the exposition text (0 when absent)."""
    for line in text.splitlines():
        match = re.fullmatch(r"([a-z_]+)(?:\{(.*)\})? (\S+)", line)
        if not match or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(match.group(3))
    return 0.0


async def test_metrics_off_by_default(fetch):
    assert_error(await fetch("/metrics"), 404, "M_UNRECOGNIZED")


class TestEnabled:
    @pytest.fixture
    def config_overrides(self):
        return {"metrics": {"enabled": True}, "rate_limit": {"enabled": False}}

    async def test_requests_logins_and_backend(self, fetch, backend, monkeypatch):
        assert_json(await fetch("/_matrix/client/versions"))
        assert_json(await fetch("/_matrix/client/versions"))
        assert_error(await fetch("/nope"), 404, "M_UNRECOGNIZED")
        assert_json(await fetch(LOGIN, "POST", json_body=body()))
        assert_error(await fetch(LOGIN, "POST", json_body=body(password="x")), 403, "M_FORBIDDEN")
        assert_error(await fetch(LOGIN, "POST", json_body=body("nobody")), 403, "M_FORBIDDEN")
        assert_error(await fetch(LOGIN, "POST", body="{"), 400, "M_NOT_JSON")

        async def down(name, *, case_insensitive=False):
            raise StoreUnavailable("down")

        monkeypatch.setattr(backend, "get_user", down)
        assert_error(await fetch(LOGIN, "POST", json_body=body()), 503, "M_UNKNOWN")

        resp = await fetch("/metrics")
        assert resp.status == 200, resp
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.body.decode()
        assert sample(text, "homeserver_http_requests_total", handler="VersionsHandler", method="GET", status="200") == 2
        assert sample(text, "homeserver_http_requests_total", handler="NotFoundHandler", status="404") == 1
        assert sample(text, "homeserver_http_request_duration_seconds_count", handler="VersionsHandler") == 2
        assert sample(text, "homeserver_logins_total", outcome="success") == 1
        assert sample(text, "homeserver_logins_total", outcome="bad_password") == 1
        assert sample(text, "homeserver_logins_total", outcome="unknown_user") == 1
        assert sample(text, "homeserver_logins_total", outcome="bad_request") == 1
        assert sample(text, "homeserver_logins_total", outcome="error") == 1
        assert sample(text, "homeserver_backend_request_duration_seconds_count", backend="file", operation="get_user") == 4
        assert sample(text, "homeserver_backend_errors_total", backend="file", operation="get_user") == 1

    async def test_openmetrics_on_request(self, fetch):
        resp = await fetch("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        assert resp.body.rstrip().endswith(b"# EOF")


class TestRateLimitedOutcome:
    @pytest.fixture
    def config_overrides(self):
        return {"metrics": {"enabled": True}, "rate_limit": {"address_burst": 3}}

    async def test_rate_limited_is_counted(self, fetch):
        for _ in range(4):
            await fetch(LOGIN, "POST", json_body=body())
        text = (await fetch("/metrics")).body.decode()
        assert sample(text, "homeserver_logins_total", outcome="rate_limited") == 1


def test_separate_port_keeps_metrics_off_the_main_app(make_config):
    config = make_config({"metrics": {"enabled": True, "port": 9999}})
    hs = build_homeserver(config)
    try:
        app = make_app(hs)
        main_paths = {rule.matcher.regex.pattern for rule in app.wildcard_router.rules}
        metrics_paths = {rule.matcher.regex.pattern for rule in make_metrics_app(hs).wildcard_router.rules}
    finally:
        hs.checker.close()
    assert not any("metrics" in p for p in main_paths)
    assert any("metrics" in p for p in metrics_paths)


def test_login_outcomes_come_from_the_error_kind_not_its_text():
    from homeserver.errors import MatrixError
    from homeserver.login import BAD_PASSWORD, UNKNOWN_USER, LoginRefused, login_outcome

    assert login_outcome(None) == "success"
    assert login_outcome(LoginRefused(UNKNOWN_USER, "unknown_user")) == "unknown_user"
    assert login_outcome(LoginRefused(BAD_PASSWORD, "bad_password")) == "bad_password"
    # A 403 with the same text that is not a refusal of rule 3 or 5 is not counted as one.
    assert login_outcome(MatrixError(403, "M_FORBIDDEN", UNKNOWN_USER)) == "error"
    assert login_outcome(MatrixError(429, "M_LIMIT_EXCEEDED", "x")) == "rate_limited"
    assert login_outcome(MatrixError(400, "M_NOT_JSON", "x")) == "bad_request"
    assert login_outcome(RuntimeError()) == "error"
