"""The routes, ordered hot-first, choose for every path what the areas' routes in their own
order choose: the order changes how soon Tornado finds a handler, never which one."""

from __future__ import annotations

import re
from unittest import mock

import tornado.web
from tornado import httputil

from homeserver.app import ROUTES
from homeserver.handlers import (
    account,
    account_page,
    devices,
    discovery,
    health,
    login,
    oauth_api,
    oauth_device,
    oauth_introspection,
    oauth_metadata,
    oauth_page,
    profile,
)
from homeserver.handlers.base import NotFoundHandler

# The areas in the order the modules were first joined (discovery first, the pages last).
DECLARED = (
    discovery.ROUTES + login.ROUTES + profile.ROUTES + account.ROUTES + devices.ROUTES + health.ROUTES
    + oauth_metadata.ROUTES + oauth_introspection.ROUTES + oauth_api.ROUTES + oauth_device.ROUTES + oauth_page.ROUTES
    + account_page.ROUTES
)
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
    assert min(order.index(rule[0]) for rule in account_page.ROUTES) > order.index("/health")


def test_the_profile_gets_its_segment_percent_decoded_as_tornado_gives_it():
    app = tornado.web.Application(list(ROUTES), default_handler_class=NotFoundHandler)
    assert chosen(app, "/_matrix/client/v3/profile/%40a%3Ab") == (profile.ProfileHandler, [b"@a:b"])
    assert chosen(app, "/_matrix/client/v3/profile/%40a%3Ab/displayname") == (
        profile.ProfileFieldHandler, [b"@a:b", b"displayname"]
    )
