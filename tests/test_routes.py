"""The fixed-path table in front of Tornado's router chooses exactly what the patterns in order choose."""

from __future__ import annotations

from unittest import mock

import tornado.web
from tornado import httputil

from homeserver.app import ROUTES, App
from homeserver.handlers.base import NotFoundHandler


def request(path: str) -> httputil.HTTPServerRequest:
    line = httputil.RequestStartLine("GET", path, "HTTP/1.1")
    headers = httputil.HTTPHeaders({"Host": "localhost"})
    return httputil.HTTPServerRequest(start_line=line, headers=headers, connection=mock.Mock())


def chosen(app: tornado.web.Application, path: str) -> tuple[type, list]:
    delegate = app.find_handler(request(path))
    return delegate.handler_class, delegate.path_args


def test_every_route_resolves_as_tornado_resolves_it():
    routes = list(ROUTES)
    ours = App(routes, default_handler_class=NotFoundHandler)
    tornados = tornado.web.Application(routes, default_handler_class=NotFoundHandler)
    paths = [*ours.fixed_paths, "/_matrix/client/v3/profile/@a:b", "/_matrix/client/v3/profile/@a:b/displayname",
             "/_matrix/client/v3/profile/%40a%3Ab", "/_matrix/client/v3/profile/%E2%9C%93+x%2Fy",
             "/_matrix/client/v3/profile/", "/_matrix/client/v3/profile/a/b/c", "/_matrix/client/v3/profile",
             "/_matrix/client/v3/profile/%ZZ", "/_matrix/client/v3/devices/ABC", "/account/elsewhere", "/nowhere",
             "/_matrix/client/versions/", "/_matrix/client/versionsX", "/_matrix/client/versions?x=1"]
    assert "/_matrix/client/versions" in ours.fixed_paths and "/_matrix/client/v3/capabilities" in ours.fixed_paths
    for path in paths:
        assert chosen(ours, path) == chosen(tornados, path), path


class First(tornado.web.RequestHandler):
    pass


class Second(tornado.web.RequestHandler):
    pass


def test_a_fixed_path_an_earlier_pattern_takes_stays_with_that_pattern():
    app = App([(r"/a/.*", First), (r"/a/b", Second), (r"/c\.d", Second), (r"/c.d", First), (r"/e", First, {"x": 1})])
    assert "/a/b" not in app.fixed_paths
    assert chosen(app, "/a/b")[0] is First
    # An unescaped dot is a pattern, not a fixed path: /cXd matches it, not the table.
    assert app.fixed_paths["/c.d"][0] is Second and chosen(app, "/cXd")[0] is First
    assert app.fixed_paths["/e"] == (First, {"x": 1})
