"""The routes, ordered hot-first, choose for every path what the areas' routes in their own
order choose: the order changes how soon Tornado finds a handler, never which one."""

from __future__ import annotations

import importlib
import pkgutil
import re
from types import ModuleType
from unittest import mock

import tornado.web
from tornado import httputil

import homeserver.handlers
from homeserver.app import ROUTES
from homeserver.handlers import profile_api
from homeserver.handlers.base import NotFoundHandler


def _catch_all(module: ModuleType) -> bool:
    return any(rule[0].endswith(".*") for rule in module.ROUTES)


# Every module of homeserver/handlers/ with ROUTES, found by walking the package (a new one is
# compared without being named here), by name, those with a catch-all pattern (the account
# pages' /account/.*) last, as a catch-all must follow the paths it would swallow.
_MODULES = [
    importlib.import_module(f"homeserver.handlers.{info.name}")
    for info in pkgutil.iter_modules(homeserver.handlers.__path__)
]
AREAS = {
    module.__name__.rsplit(".", 1)[1]: module
    for module in sorted((m for m in _MODULES if hasattr(m, "ROUTES")), key=lambda m: (_catch_all(m), m.__name__))
}
# The areas' routes, each area's in its own order.
DECLARED = tuple(rule for module in AREAS.values() for rule in module.ROUTES)

# A route whose pattern is fixed text names its own path (dots escaped).
_FIXED = re.compile(r"(?:[A-Za-z0-9_/~-]|\\\.)+")

SAMPLES = [
    "/_matrix/client/v3/profile/@a:b", "/_matrix/client/v3/profile/@a:b/displayname",
    "/_matrix/client/v3/profile/@a:b/avatar_url", "/_matrix/client/v3/profile/%40a%3Ab",
    "/_matrix/client/v3/profile/%E2%9C%93+x%2Fy", "/_matrix/client/v3/profile/", "/_matrix/client/v3/profile/a/b/c",
    "/_matrix/client/v3/profile", "/_matrix/client/v3/profile/%ZZ", "/_matrix/client/v3/devices/ABC",
    "/_matrix/client/v3/devices/", "/account/elsewhere", "/account/style.css", "/account/styleXcss", "/account/",
    "/account", "/nowhere", "/", "/_matrix/client/versions/", "/_matrix/client/versionsX",
    "/_matrix/client/versions?x=1", "/.well-known/matrix/clientX", "/health/ready/", "/oauth2/introspect/x",
    "/account/authorize", "/account/device", "/oauth2/token", "/oauth2/device", "/oauth2/registration",
    "/.well-known/oauth-authorization-server", "/_matrix/client/v1/auth_metadata",
    "/account/sso", "/account/ssoX", "/_matrix/client/v3/login/sso/redirect", "/_matrix/client/r0/login/sso/redirect/",
    "/_matrix/client/v3/login/sso/redirect/oidc-x", "/_matrix/client/v3/login/sso/redirect/a/b",
]


def request(path: str) -> httputil.HTTPServerRequest:
    line = httputil.RequestStartLine("GET", path, "HTTP/1.1")
    headers = httputil.HTTPHeaders({"Host": "localhost"})
    return httputil.HTTPServerRequest(start_line=line, headers=headers, connection=mock.Mock())


def chosen(app: tornado.web.Application, path: str) -> tuple[type, list]:
    delegate = app.find_handler(request(path))
    return delegate.handler_class, delegate.path_args


def fixed_paths(routes) -> list[str]:
    return [rule[0].replace("\\.", ".") for rule in routes if _FIXED.fullmatch(rule[0])]


def test_the_hot_first_order_chooses_what_the_declared_order_chooses():
    assert sorted(map(repr, ROUTES)) == sorted(map(repr, DECLARED))  # the same routes, reordered
    ours = tornado.web.Application(list(ROUTES), default_handler_class=NotFoundHandler)
    declared = tornado.web.Application(list(DECLARED), default_handler_class=NotFoundHandler)
    paths = fixed_paths(ROUTES) + SAMPLES
    assert "/_matrix/client/versions" in paths and "/_matrix/client/v3/capabilities" in paths
    for path in paths:
        assert chosen(ours, path) == chosen(declared, path), path


def test_each_fixed_path_reaches_its_own_handler():
    app = tornado.web.Application(list(ROUTES), default_handler_class=NotFoundHandler)
    for rule in ROUTES:
        if _FIXED.fullmatch(rule[0]):
            assert chosen(app, rule[0].replace("\\.", ".")) == (rule[1], []), rule[0]
    assert chosen(app, "/nowhere")[0] is NotFoundHandler


def test_the_hot_paths_come_first():
    hot = [r"/_matrix/client/v3/capabilities", r"/_matrix/client/v3/account/whoami", r"/_matrix/client/versions"]
    order = [rule[0] for rule in ROUTES]
    assert max(order.index(path) for path in hot) < order.index("/_matrix/client/v3/login")
    assert order.index("/_matrix/client/v3/profile/([^/]+)") < order.index("/_matrix/client/v3/login")
    assert min(order.index(rule[0]) for rule in AREAS["account_pages"].ROUTES) > order.index("/health")


def test_the_profile_gets_its_segment_percent_decoded_as_tornado_gives_it():
    app = tornado.web.Application(list(ROUTES), default_handler_class=NotFoundHandler)
    assert chosen(app, "/_matrix/client/v3/profile/%40a%3Ab") == (profile_api.ProfileHandler, [b"@a:b"])
    assert chosen(app, "/_matrix/client/v3/profile/%40a%3Ab/displayname") == (
        profile_api.ProfileFieldHandler, [b"@a:b", b"displayname"]
    )
