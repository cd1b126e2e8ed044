"""The handlers' bases: the request plumbing every handler shares (`ServerHandler`: the server's
parts, in-flight tracking, the client's address, the request ID, the log of unexpected errors),
and the API's (`BaseHandler`: CORS, exact JSON responses, Matrix errors, access tokens). The
account page's base (handlers/page_base.py) is the plumbing's other child: as jupyter_server's
`APIHandler` beside its page handlers, each side changes its headers and `write_error` only."""

from __future__ import annotations

import logging
import time
from typing import Any

import tornado
from tornado import httputil
from tornado.web import HTTPError, RequestHandler

from homeserver import audit, request_id
from homeserver.context import HomeServer
from homeserver.errors import (
    M_INVALID_PARAM,
    M_MISSING_TOKEN,
    M_UNKNOWN,
    HTTPProblem,
    MatrixError,
    StoreDataError,
    StoreUnavailable,
    store_unavailable,
    too_large,
    unknown_token,
    unrecognized,
)
from homeserver.jsonio import encode_json
from homeserver.logs import scrub_uri
from homeserver.requester import Requester

logger = logging.getLogger(__name__)

CORS_HEADERS = (
    ("Access-Control-Allow-Origin", "*"),
    ("Access-Control-Allow-Methods", "GET, POST, PUT, DELETE, OPTIONS"),
    ("Access-Control-Allow-Headers", "X-Requested-With, Content-Type, Authorization"),
)
JSON_TYPE = "application/json"
SERVER_HEADER = f"TornadoServer/{tornado.version}"
# Every answer, errors included: a login's token or a person's devices and profile must not
# be kept by a browser or a proxy. Synapse's value (older caches heed no-cache and
# must-revalidate; no-store is the one RFC 9111 needs).
CACHE_CONTROL = "no-cache, no-store, must-revalidate"
_date: tuple[int, str] = (-1, "")


def _http_date() -> str:
    """The Date header's text, formatted once a second rather than for every response."""
    global _date
    now = time.time()
    if int(now) != _date[0]:
        _date = (int(now), httputil.format_timestamp(now))
    return _date[1]


class ServerHandler(RequestHandler):
    """Every handler's plumbing, API or page: the server's parts, the request tracked while in
    flight (a graceful shutdown waits for it), the client's address, the request ID."""

    # The server's parts (homeserver.context): every handler's one door to them (set by
    # clear(), which Tornado calls first of all, so an attribute rather than a lookup).
    hs: HomeServer
    # Errors a handler raises to answer (its write_error says them): not logged as faults.
    expected_errors: tuple[type[BaseException], ...] = (HTTPError,)
    _client_ip: str | None = None
    _request_id: str | None = None

    def clear(self) -> None:
        self.hs = self.application.settings["homeserver"]
        super().clear()

    def initialize(self) -> None:
        # Track the request so a graceful shutdown waits for it (see homeserver.inflight).
        self.hs.inflight.add(self)

    def _untrack(self) -> None:
        self.hs.inflight.discard(self)

    def on_finish(self) -> None:
        self._untrack()

    def on_connection_close(self) -> None:
        super().on_connection_close()  # it fails a streamed body's pending read
        self._untrack()

    @property
    def client_ip(self) -> str:
        """The client's address: the peer, or X-Forwarded-For from a trusted proxy."""
        if self._client_ip is None:
            self._client_ip = self.hs.client_address(self.request)
            audit.client_address.set(self._client_ip)  # for the audit lines the request writes
        return self._client_ip

    def set_request_headers(self) -> None:
        """The headers every answer carries: its request ID, and `Connection: close` while
        the server drains (clients should not send more on this connection)."""
        headers = self._headers
        hs = self.hs
        headers[request_id.HEADER] = self._request_id or self._begin_request(hs)
        if hs.inflight.draining:
            headers["Connection"] = "close"

    def _begin_request(self, hs: HomeServer) -> str:
        """Choose this request's ID (set_default_headers runs first, as Tornado makes the handler)."""
        addresses = hs.client_address
        if addresses.networks and addresses.is_trusted(self.request.remote_ip or ""):
            chosen = request_id.choose(self.request.headers.get(request_id.HEADER), True)
        else:
            # Only a trusted proxy's header counts: no need to look (a missing header is an
            # exception inside HTTPHeaders.get, the dearest step of this method).
            chosen = request_id.new_id()
        self._request_id = chosen
        request_id.begin(chosen)
        return chosen

    def compute_etag(self) -> None:
        # Neither Matrix clients nor the page revalidate; hashing every body is waste.
        return None

    # -- errors: the one path -------------------------------------------------------

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """Every raised error's answer: the problem it is (`problem`), answered."""
        exc = kwargs.get("exc_info", (None, None, None))[1]
        self.answer_problem(self.problem(status_code, exc))

    def answer_problem(self, problem: HTTPProblem) -> None:
        """Answer with a problem: its status and headers (`apply_problem`), then its body."""
        self.apply_problem(problem)
        self.write_problem(problem)

    def apply_problem(self, problem: HTTPProblem) -> None:
        """The one place an error's status and headers (Retry-After, WWW-Authenticate) go on
        the answer; a page that shows an error inline applies it here too."""
        self.set_status(problem.status)
        for name, value in problem.headers.items():
            self.set_header(name, value)

    def problem(self, status_code: int, exc: BaseException | None) -> HTTPProblem:
        """What an error is, as this side of the server says it (a Matrix error, a page error)."""
        return HTTPProblem(status_code, httputil.responses.get(status_code, "Error"))

    def write_problem(self, problem: HTTPProblem) -> None:
        """The body of an error answer; the status and headers are set already."""
        self.finish(encode_json(problem.body()))

    def log_exception(self, typ: Any, value: BaseException | None, tb: Any) -> None:
        if self._finished and self.hs.inflight.draining:
            # The drain timeout answered this request 503 (homeserver.inflight), then the
            # shutdown closed what it was waiting for (a queued password check is
            # cancelled, a store connection closed): expected, and already answered.
            logger.debug("%s %s cut off by the shutdown: %r", self.request.method, self.request.path, value)
            return
        if isinstance(value, MatrixError):
            if value.status >= 500:
                logger.error("%s %s: %s", self.request.method, self.request.path, value)
            return
        if isinstance(value, StoreUnavailable):
            logger.warning("%s unavailable: %s", value.store, value)
            return
        if isinstance(value, StoreDataError):
            logger.error("operator error in the user store: %s", value)
            return
        if isinstance(value, self.expected_errors):
            return
        # Not Tornado's default: its summary shows the URI with any ?access_token= in it.
        logger.error(
            "uncaught exception in %s %s",
            self.request.method,
            scrub_uri(self.request.uri or ""),
            exc_info=(typ, value, tb) if value is not None else None,
        )


class BaseHandler(ServerHandler):
    """The API's base: no HTML, no charset suffix, CORS everywhere, OPTIONS answered, Matrix errors."""

    requester: Requester | None = None
    # The access line's level when the handler says its answer is expected (homeserver.logs);
    # None: by the status.
    access_log_level: int | None = None

    def clear(self) -> None:
        """Tornado's clear(), with the Date header formatted once a second instead of per response."""
        self.hs = self.application.settings["homeserver"]
        # Same headers in the same order as Tornado's; Content-Type is set below.
        self._headers = httputil.HTTPHeaders(
            {"Server": SERVER_HEADER, "Content-Type": JSON_TYPE, "Date": _http_date(), "Cache-Control": CACHE_CONTROL}
        )
        self.set_default_headers()
        self._write_buffer = []
        self._status_code = 200
        self._reason = httputil.responses[200]

    def set_default_headers(self) -> None:
        # Content-Type is in place already: clear(), Tornado's one caller of this, sets it.
        headers = self._headers
        for name, value in CORS_HEADERS:
            headers[name] = value
        self.set_request_headers()

    def check_etag_header(self) -> bool:
        # With no ETag there is nothing to match, whatever If-None-Match says: Tornado's own
        # check reaches that answer after two header lookups and a regex, on every response.
        if "Etag" not in self._headers:
            return False
        return super().check_etag_header()

    def options(self, *args: Any, **kwargs: Any) -> None:
        """Pre-flight: CORS headers only, no endpoint logic, no auth."""
        self.set_status(204)
        self.finish()

    async def head(self, *args: Any, **kwargs: Any) -> None:
        """HEAD wherever GET is answered (load balancers probe /health with it).

        The GET runs as is: same status, same headers, Content-Length of the body it
        would send; Tornado writes no body for a HEAD request. No GET here: 405.
        """
        if type(self).get is RequestHandler.get:
            raise HTTPError(405)
        result = self.get(*args, **kwargs)
        if result is not None:
            await result

    def write_json(self, value: Any) -> None:
        self.finish(encode_json(value))

    def decode_argument(self, value: bytes, name: str | None = None) -> str:
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise MatrixError(400, M_INVALID_PARAM, f"Invalid UTF-8 in {name or 'the path'}") from None

    # -- errors ---------------------------------------------------------------------

    def problem(self, status_code: int, exc: BaseException | None) -> HTTPProblem:
        """A Matrix error: the one raised, or what a store outage or a Tornado error means."""
        if isinstance(exc, MatrixError):
            return exc
        if isinstance(exc, StoreUnavailable):
            return store_unavailable(exc)
        if isinstance(exc, HTTPError) or exc is None:
            if status_code in (404, 405):
                return unrecognized(status_code)
            if status_code == 413:
                return too_large(self.hs.max_body_size)
            if 400 <= status_code < 500:
                reason = httputil.responses.get(status_code, "Bad request")
                return MatrixError(status_code, M_UNKNOWN, reason)
        return MatrixError(500, M_UNKNOWN, "Internal server error")

    # -- access tokens ----------------------------------------------------

    def access_token(self) -> str:
        """Take the token from `Authorization: Bearer` or the `access_token` query parameter."""
        headers = self.request.headers.get_list("Authorization")
        query = self.request.query_arguments.get("access_token")
        if len(headers) > 1:
            raise MatrixError(401, M_MISSING_TOKEN, "Too many Authorization headers.")
        if headers:
            if query:
                raise MatrixError(
                    401, M_MISSING_TOKEN, "Mixing Authorization headers and access_token query parameters."
                )
            scheme, _, token = headers[0].strip().partition(" ")
            token = token.strip()
            if scheme.lower() != "bearer" or not token:
                raise MatrixError(401, M_MISSING_TOKEN, "Invalid Authorization header.")
            return token
        if query:
            if len(query) > 1:
                raise MatrixError(401, M_MISSING_TOKEN, "Too many access_token query parameters.")
            try:
                return query[0].decode("utf-8")
            except UnicodeDecodeError:
                raise unknown_token() from None
        raise MatrixError(401, M_MISSING_TOKEN, "Missing access token.")

    async def authenticate(self, *, allow_locked: bool = False) -> Requester:
        """Authenticate the request's access token (homeserver.auth); sets `self.requester`.

        A locked account's token is 401 M_USER_LOCKED unless `allow_locked` (logout)."""
        self.requester = await self.hs.auth.requester(self.access_token(), self.client_ip, allow_locked=allow_locked)
        return self.requester


class NotFoundHandler(BaseHandler):
    """Every unknown path, any method: 404 M_UNRECOGNIZED (OPTIONS still answers 204)."""

    SUPPORTED_METHODS = ("GET", "HEAD", "POST", "DELETE", "PATCH", "PUT", "OPTIONS")

    def prepare(self) -> None:
        if self.request.method != "OPTIONS":
            raise unrecognized()
