"""Routes: every handler module's ROUTES, wired to the server's parts (homeserver.context)."""

from __future__ import annotations

import re
from typing import Any

import tornado.web
from tornado import httputil

from homeserver.account_page import cookie_key
from homeserver.context import HomeServer
from homeserver.handlers import account, account_page, devices, discovery, health, login, oauth, profile
from homeserver.handlers.base import NotFoundHandler
from homeserver.logs import log_request

# Tornado tries the patterns in order until one matches: the areas most requested come
# first (a client's versions, capabilities, whoami and profile lookups; Synapse's token
# introspection under delegation), the pages last. No pattern of one area matches a path
# of another, so the order changes only how soon a request finds its handler.
ROUTES = (
    account.ROUTES + discovery.ROUTES + profile.ROUTES + oauth.ROUTES + login.ROUTES + devices.ROUTES
    + health.ROUTES + account_page.ROUTES
)


# A pattern that matches one path only: literal characters, dots escaped.
_LITERAL = re.compile(r"(?:[A-Za-z0-9_/~-]|\\\.)+")
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
        super().__init__(rest, **settings)

    def find_handler(self, request: httputil.HTTPServerRequest, **kwargs: Any) -> tornado.web._HandlerDelegate:
        path = request.path
        found = self.fixed_paths.get(path)
        if found is not None:
            return self.get_handler_delegate(request, found[0], found[1])
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
