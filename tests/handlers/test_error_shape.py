"""One error shape: every kind of error (Matrix, OAuth, page) carries its status and headers,
and the handlers apply them in one place, whichever side (API, OAuth API, page) answers."""

from __future__ import annotations

import pytest
import tornado.web

from homeserver.account_page import cookie_key
from homeserver.errors import HTTPProblem, MatrixError, PageError, limit_exceeded
from homeserver.handlers.base import BaseHandler
from homeserver.handlers.oauth_api import OAuthApiHandler
from homeserver.handlers.page_base import PageHandler
from homeserver.oauth.errors import INVALID_CLIENT, OAuthError, too_many


class Raises:
    raised: HTTPProblem

    def get(self) -> None:
        raise self.raised


class ApiRaises(Raises, BaseHandler):
    raised = limit_exceeded(2.5)


class OAuthRaises(Raises, OAuthApiHandler):
    raised = too_many("slow down", 7.2)


class OAuthClientRaises(Raises, OAuthApiHandler):
    raised = OAuthError(INVALID_CLIENT, "who are you")


class PageRaises(Raises, PageHandler):
    raised = PageError(429, "Too many attempts.", {"Retry-After": "9"})


class PageMatrixRaises(Raises, PageHandler):
    # A service's Matrix error reaching a page: the page's sentence, the header kept.
    raised = limit_exceeded(4)


class PageShows(PageHandler):
    """A page that shows an error inline (a form again, with what was wrong) instead of raising."""

    def get(self) -> None:
        self.render_page("error.html", problem=PageError(503, "Down.", {"Retry-After": "5"}), message="Down.")


@pytest.fixture
def app(hs):
    return tornado.web.Application(
        [
            (r"/api", ApiRaises),
            (r"/oauth", OAuthRaises),
            (r"/oauth-client", OAuthClientRaises),
            (r"/page", PageRaises),
            (r"/page-matrix", PageMatrixRaises),
            (r"/page-inline", PageShows),
        ],
        homeserver=hs,
        cookie_secret=cookie_key(hs.tokens.secret),
    )


def test_every_kind_is_one_shape():
    for problem in (limit_exceeded(1), too_many("x", 1), PageError(429, "x", {"Retry-After": "1"})):
        assert isinstance(problem, HTTPProblem)
        assert (problem.status, problem.headers) == (429, {"Retry-After": "1"})
    matrix = MatrixError(400, "M_X", "words", headers={"A": "b"}, extra=1)
    assert (matrix.status, matrix.message, matrix.headers, matrix.body()) == (
        400, "words", {"A": "b"}, {"errcode": "M_X", "error": "words", "extra": 1}
    )
    oauth = OAuthError("invalid_grant", "no")
    assert (oauth.status, oauth.message, oauth.description, oauth.body()) == (
        400, "no", "no", {"error": "invalid_grant", "error_description": "no"}
    )


async def test_the_api_applies_the_headers(fetch):
    resp = await fetch("/api")
    assert resp.status == 429
    assert resp.headers["Retry-After"] == "3"
    assert resp.json == {"errcode": "M_LIMIT_EXCEEDED", "error": "Too many requests", "retry_after_ms": 2500}


async def test_the_oauth_api_applies_the_headers(fetch):
    resp = await fetch("/oauth")
    assert resp.status == 429
    assert resp.headers["Retry-After"] == "8"
    assert resp.headers["Cache-Control"] == "no-store"
    assert resp.json == {"error": "temporarily_unavailable", "error_description": "slow down"}
    resp = await fetch("/oauth-client")
    assert resp.status == 400
    assert resp.headers["WWW-Authenticate"] == "Basic"


@pytest.mark.parametrize(("path", "status", "retry"), [("/page", 429, "9"), ("/page-matrix", 429, "4"),
                                                       ("/page-inline", 503, "5")])
async def test_pages_apply_the_headers(fetch, path, status, retry):
    resp = await fetch(path)
    assert resp.status == status, resp.body
    assert resp.headers["Retry-After"] == retry
    assert resp.headers["Content-Type"].startswith("text/html")
    assert b"<!DOCTYPE html>" in resp.body
