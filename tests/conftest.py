"""Factory fixtures: users, config, backend, app, fetch and login.

Tests change the set-up by overriding the small fixtures: `user_records` (what the users
file holds), `config_overrides` ({section: {key: value}}), or `backend` itself.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from homeserver.app import make_app
from homeserver.config import Config, build_config
from homeserver.context import build_homeserver, create_backend, create_session_store
from tests.support.delegation_fakes import FakeSynapse
from tests.support.helpers import DEFAULT_USERS, JWT_SECRET, TEST_ROUNDS, Response, assert_json
from tests.support.servers import ServerProcess

Fetch = Callable[..., Awaitable[Response]]

# The tiers of real parts a test needs, as pytest markers (registered in pytest.ini), put on
# each test by pytest_collection_modifyitems from what it uses, so no test file names them:
# `pytest -m "not synapse and not browser"` runs the rest. A test needs a tier when it uses
# one of its fixtures, is parametrized with its name as a value (a store or backend "redis"
# or "ldap", a fixture then fetched with request.getfixturevalue), or, for the browser and
# node, calls their starters itself.
TIER_FIXTURES = {
    "redis": {"redis_server", "redis_url", "redis_users", "redis_cluster", "sentinel_setup"},
    "ldap": {"slapd"},  # and any fixture named *_slapd (a test's private directory)
    "synapse": {"synapse_stack", "synapse_schema_sqlite", "synapse_schema_postgres", "synapse_db",
                "synapse_before", "synapse_auth_code", "lifecycle_synapse"},
    "postgres": {"postgres_cluster"},
    "browser": {"driver", "axe_source"},
    "node": {"js_sdk", "js_chat", "js_upload", "axe_source"},
}
TIER_PARAMS = {"redis": "redis", "ldap": "ldap", "postgres": "postgres"}
TIER_CALLS = {"browser": {"chrome"}, "node": {"install_js_sdk"}}
# A per-test limit above pytest.ini's default: a real Synapse starts (and, the first time,
# its virtualenv is made) inside the test that first needs it.
TIER_TIMEOUTS = {"synapse": 900}


def tiers_of(item: pytest.Item) -> set[str]:
    names = set(getattr(item, "fixturenames", ()))
    tiers = {tier for tier, fixtures in TIER_FIXTURES.items() if names & fixtures}
    if any(name.endswith("_slapd") for name in names):
        tiers.add("ldap")
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec is not None else {}
    tiers |= {tier for tier, value in TIER_PARAMS.items() if value in params.values()}
    if params.get("delegation") is True:  # tests/backends/test_config_matrix.py's rows with a real Synapse
        tiers.add("synapse")
    function = getattr(item, "function", None)
    called = set(function.__code__.co_names) if function is not None and hasattr(function, "__code__") else set()
    tiers |= {tier for tier, calls in TIER_CALLS.items() if called & calls}
    return tiers


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tiers = tiers_of(item)
        for tier in sorted(tiers):
            item.add_marker(tier)
        limits = [TIER_TIMEOUTS[t] for t in tiers if t in TIER_TIMEOUTS]
        if limits and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(max(limits)))


@pytest.fixture
def user_records() -> list[dict[str, Any]]:
    return [dict(r) for r in DEFAULT_USERS]


@pytest.fixture
def users_path(tmp_path, user_records) -> str:
    path = tmp_path / "users.json"
    path.write_text(json.dumps({"users": user_records}))
    return str(path)


@pytest.fixture
def config_overrides() -> dict[str, dict[str, Any]]:
    return {}


@pytest.fixture
def make_config(tmp_path, users_path) -> Callable[..., Config]:
    """Build a Config as if from tmp_path/homeserver.toml, with no environment."""

    def make(overrides: dict[str, dict[str, Any]] | None = None, environ: dict[str, str] | None = None) -> Config:
        document: dict[str, Any] = {
            # bcrypt_rounds: the cost of the stand-in hash an unknown address is checked against.
            "auth": {"jwt_secret": JWT_SECRET, "bcrypt_rounds": TEST_ROUNDS},
            "backend": {"type": "file", "file": {"path": users_path}},
            # Rate limits stay on, as in production, with bursts no ordinary test reaches;
            # tests of the limits set their own (tests/test_ratelimit.py).
            "rate_limit": {"address_burst": 10_000, "account_burst": 10_000, "failed_attempts_burst": 10_000},
        }
        for section, values in (overrides or {}).items():
            target = document
            for part in section.split("."):
                target = target.setdefault(part, {})
            target.update(values)
        return build_config(document, path=str(tmp_path / "homeserver.toml"), environ=environ or {})

    return make


@pytest.fixture
def config(make_config, config_overrides) -> Config:
    return make_config(config_overrides)


@pytest.fixture
def backend(config, io_loop):
    backend = create_backend(config)
    io_loop.run_sync(backend.start)
    yield backend
    io_loop.run_sync(backend.close)


@pytest.fixture
def session_store(config, io_loop):
    """The configured session store (SQLite in tmp_path unless a test overrides it), started."""
    store = create_session_store(config)
    io_loop.run_sync(store.start)
    yield store
    io_loop.run_sync(store.close)


@pytest.fixture
def hs(config, backend, session_store, io_loop):
    hs = build_homeserver(config, backend, session_store)
    io_loop.run_sync(hs.start)
    yield hs
    io_loop.run_sync(hs.stop)
    if hs.delegation is not None:  # a `[delegation]` section's Synapse client
        io_loop.run_sync(hs.delegation.close)
    hs.checker.close()


@pytest.fixture
def synapse(io_loop):
    """An in-process fake of Synapse's /_synapse/mas/ API (tests/support/delegation_fakes.py), started;
    a test points the server at it with `config_overrides` {"delegation": synapse.section()}."""
    fake = FakeSynapse()
    fake.start()
    yield fake
    io_loop.run_sync(fake.stop)


@pytest.fixture
def app(hs):
    return make_app(hs)


@pytest.fixture
def fetch(http_server_client) -> Fetch:
    """fetch(path, method="GET", json=..., body=..., token=..., headers=...) -> Response."""

    async def do(
        path: str,
        method: str = "GET",
        *,
        json_body: Any = None,
        body: bytes | str | None = None,
        token: str | None = None,
        headers: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> Response:
        headers = dict(headers or {})
        if json_body is not None:
            body = json.dumps(json_body)
            headers.setdefault("Content-Type", "application/json")
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        if body is None and method in ("POST", "PUT", "PATCH") and "body_producer" not in kwargs:
            body = b""
        resp = await http_server_client.fetch(
            path,
            method=method,
            body=body,
            headers=headers,
            raise_error=False,
            allow_nonstandard_methods=True,
            **kwargs,
        )
        return Response(resp.code, resp.headers, resp.body or b"")

    return do


@pytest.fixture
def login(fetch) -> Callable[..., Awaitable[dict[str, Any]]]:
    """login(user, password, **extra) -> the 200 login response body."""

    async def do(user: str = "alice", password: str = "wonderland", **extra: Any) -> dict[str, Any]:
        body = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user}, "password": password}
        body.update(extra)
        return assert_json(await fetch("/_matrix/client/v3/login", "POST", json_body=body))

    return do


@pytest.fixture
def start(tmp_path):
    """start(processes=1, **server) -> a `run.py` ServerProcess in tmp_path, killed afterwards."""
    servers: list[ServerProcess] = []

    def do(processes: int = 1, _extra: str = "", **server: object) -> ServerProcess:
        servers.append(ServerProcess(tmp_path, processes, _extra, **server))
        return servers[-1]

    yield do
    for server in servers:
        server.stop()


@pytest.fixture
def conf(tmp_path):
    """A config for the command line: the file backend in tmp_path, cheap bcrypt."""
    path = tmp_path / "hs.toml"
    path.write_text('[auth]\nbcrypt_rounds = 4\n[backend.file]\npath = "users.json"\n')
    return path


@pytest.fixture(scope="session")
def synapse_stack(tmp_path_factory):
    """This server as the authentication service of a real Synapse, both behind a real nginx
    (tests/support/delegation_stack.py); one for the whole session. Skipped with the reason when
    Synapse or nginx cannot be had, and failed for it when CI is set."""
    from tests.support.delegation_stack import DelegationStack, serve

    yield from serve(DelegationStack, tmp_path_factory.mktemp("synapse-stack"))
