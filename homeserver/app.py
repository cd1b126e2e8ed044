"""Routes: every handler module's ROUTES, wired to the server's parts (homeserver.context)."""

from __future__ import annotations

from typing import Any

import tornado.web

from homeserver.account_page import cookie_key
from homeserver.context import HomeServer
from homeserver.handlers import (
    account_api,
    account_pages,
    devices_api,
    discovery_api,
    health_api,
    introspection_api,
    login_api,
    oauth_api,
    oauth_device_pages,
    oauth_metadata_api,
    oauth_pages,
    profile_api,
    refresh_api,
    second_step_pages,
    security_pages,
    sso_pages,
)
from homeserver.handlers.base import NotFoundHandler
from homeserver.logs import log_request

# Tornado tries the patterns in order until one matches (a regex each): the
# areas most requested come first (a client's capabilities, whoami, profile lookups and
# versions; Synapse's token introspection under delegation), the pages last. No pattern
# of one area matches a path of another, so the order changes only how soon a request
# finds its handler (tests/test_routes.py compares every path with the areas' own order).
ROUTES = (
    account_api.ROUTES + profile_api.ROUTES + discovery_api.ROUTES + introspection_api.ROUTES
    + oauth_metadata_api.ROUTES + login_api.ROUTES + refresh_api.ROUTES + devices_api.ROUTES + health_api.ROUTES
    + oauth_api.ROUTES + oauth_device_pages.ROUTES + oauth_pages.ROUTES + sso_pages.ROUTES
    + second_step_pages.ROUTES + security_pages.ROUTES + account_pages.ROUTES
)


def make_app(hs: HomeServer) -> tornado.web.Application:
    """The client API; /metrics too when metrics are on and have no port of their own."""
    metrics = hs.metrics
    routes: list[Any] = list(ROUTES)
    if metrics is not None and not hs.config.get("metrics", "port"):
        routes += health_api.METRICS_ROUTES

    def log_function(handler: tornado.web.RequestHandler) -> None:
        log_request(handler)
        if metrics is not None:
            metrics.observe_request(handler)

    return tornado.web.Application(
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
        health_api.METRICS_ROUTES,
        default_handler_class=NotFoundHandler,
        log_function=lambda handler: None,
        homeserver=hs,
    )
