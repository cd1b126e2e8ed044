"""Routes: every handler module's ROUTES, wired to the server's parts (homeserver.context)."""

from __future__ import annotations

import re
from typing import Any

import tornado.web
from tornado import httputil
from tornado.escape import url_unescape

from homeserver.account_page import cookie_key
from homeserver.context import HomeServer
from homeserver.handlers import (
    account,
    account_page,
    devices,
    discovery,
    health,
    login,
    oauth,
    oauth_api,
    oauth_device,
    oauth_page,
    profile,
)
from homeserver.handlers.base import NotFoundHandler
from homeserver.logs import log_request

ROUTES = (
    discovery.ROUTES + login.ROUTES + profile.ROUTES + account.ROUTES + devices.ROUTES + health.ROUTES
    + oauth.ROUTES + oauth_api.ROUTES + oauth_device.ROUTES + oauth_page.ROUTES + account_page.ROUTES
)


# A pattern that matches one path only: literal characters, dots escaped.
_LITERAL = re.compile(r"(?:[A-Za-z0-9_/~-]|\\\.)+")
# A fixed prefix and one path segment: /_matrix/client/v3/profile/([^/]+)
_ONE_SEGMENT = re.compile(r"((?:[A-Za-z0-9_/~-]|\\\.)+/)\(\[\^/\]\+\)\$?")


class App(tornado.web.Application):
    """Tornado's Application, with the routes that name one fixed path found by a dict lookup.

    Tornado tries the routes' patterns in order, a regex match each, before it reaches the
    one for a request; most of this API's paths are fixed text (`/_matrix/client/versions`,
    `/_matrix/client/v3/capabilities`), so those are looked up directly. A fixed path is
    only taken from the table when no earlier pattern also matches it, so the handler
    chosen is always the one the patterns in order would choose; every other path (and
    every path not in the table) goes through Tornado's router as before.
    """

    def __init__(self, handlers: list[Any], **settings: Any) -> None:
        self.fixed_paths: dict[str, tuple[type[tornado.web.RequestHandler], dict[str, Any] | None]] = {}
        earlier: list[re.Pattern[str]] = []
        # Tornado's router keeps the rest: a fixed pattern matches its own path only, which
        # the table answers first, so the router never needs to try it.
        rest: list[Any] = []
        for index, rule in enumerate(handlers):
            if not isinstance(rule, tuple):  # a URLSpec or Rule: the table stops before it
                rest += handlers[index:]
                break
            pattern, handler = rule[0], rule[1]
            kwargs = rule[2] if len(rule) > 2 else None
            path = pattern.replace("\\.", ".")
            if _LITERAL.fullmatch(pattern) and path not in self.fixed_paths and not any(p.match(path) for p in earlier):
                self.fixed_paths[path] = (handler, kwargs)
            else:
                rest.append(rule)
            earlier.append(re.compile(pattern if pattern.endswith("$") else pattern + "$"))
        # The first pattern left, when it is a fixed prefix and one segment (the profile), is
        # matched without a regex too: no pattern before it can match what it matches.
        self.segment_route: tuple[str, type[tornado.web.RequestHandler], dict[str, Any] | None] | None = None
        if rest and isinstance(rest[0], tuple) and (shape := _ONE_SEGMENT.fullmatch(rest[0][0])):
            self.segment_route = (shape[1].replace("\\.", "."), rest[0][1], rest[0][2] if len(rest[0]) > 2 else None)
        super().__init__(rest, **settings)

    def find_handler(self, request: httputil.HTTPServerRequest, **kwargs: Any) -> tornado.web._HandlerDelegate:
        path = request.path
        found = self.fixed_paths.get(path)
        if found is not None:
            return self.get_handler_delegate(request, found[0], found[1])
        route = self.segment_route
        if route is not None and path.startswith(route[0]):
            segment = path[len(route[0]):]
            if segment and "/" not in segment:
                # What Tornado's router hands the handler: the segment percent-decoded, as bytes.
                argument = url_unescape(segment, encoding=None, plus=False)
                return self.get_handler_delegate(request, route[1], route[2], [argument])
        return super().find_handler(request, **kwargs)


def make_app(hs: HomeServer) -> App:
    """The client API; /metrics too when metrics are on and have no port of their own."""
    metrics = hs.metrics
    routes = list(ROUTES)
    if metrics is not None and not hs.config.get("metrics", "port"):
        routes += health.METRICS_ROUTES

    def log_function(handler: tornado.web.RequestHandler) -> None:
        log_request(handler)
        if metrics is not None:
            metrics.observe_request(handler)

    return App(
        routes,
        default_handler_class=NotFoundHandler,
        log_function=log_function,
        homeserver=hs,
        # Signs the account page's cookie only (homeserver.account_page); the API uses no cookie.
        cookie_secret=cookie_key(hs.tokens.secret),
    )


def make_metrics_app(hs: HomeServer) -> tornado.web.Application:
    """/metrics alone, for `[metrics] port`: keeps it off the public listener."""
    return tornado.web.Application(
        health.METRICS_ROUTES,
        default_handler_class=NotFoundHandler,
        log_function=lambda handler: None,
        homeserver=hs,
    )
