"""Tornado's HTTPServer, answering the requests it would drop for their size.

Tornado closes the connection without a word when a request's head (request line and
headers) is past `max_header_size`, and answers a bare `400 Bad Request` when a body is
past `max_body_size`. A client (or the proxy in front) cannot tell either from a network
fault or a malformed request. Here they are `431 Request Header Fields Too Large` and
`413 Content Too Large`, each with a Matrix error body (`M_TOO_LARGE`), an access line,
and the connection closed after the answer, as before.

Handlers that take a body (homeserver.handlers.body) answer 413 themselves at
`[server] max_body_size`; the limit here is the server's backstop for every other handler
(which Tornado would buffer), as before.
"""

from __future__ import annotations

import socket
import sys
import time
from typing import Any

from tornado import httputil
from tornado.httpserver import HTTPServer
from tornado.iostream import IOStream, UnsatisfiableReadError

from homeserver import request_id
from homeserver.errors import M_TOO_LARGE, MatrixError, too_large
from homeserver.jsonio import encode_json
from homeserver.logs import ACCESS_FORMAT, access_log, scrub_uri
from homeserver.request_id import HEADER as REQUEST_ID_HEADER
from homeserver.request_id import new_id

# Tornado's own bound, moved out of the way: the BodyLimit delegate enforces the real one
# (Tornado's check would answer a bare 400 first, and after a handler's 413 too).
UNBOUNDED = 1 << 62


def error_answer(error: MatrixError, request_id: str) -> tuple[dict[str, str], bytes]:
    """The headers and body of a Matrix error answered outside any handler."""
    body = encode_json(error.body())
    headers = {
        "Content-Type": "application/json",
        "Content-Length": str(len(body)),
        "Cache-Control": "no-store",
        # As every answer of the API: a browser client may read the status.
        "Access-Control-Allow-Origin": "*",
        REQUEST_ID_HEADER: request_id,
        "Connection": "close",
    }
    return headers, body


def log_refusal(status: int, method: str, path: str, client: str, started: float, rid: str) -> None:
    """The access line of a request answered here (the request's ID on it, as on any other)."""
    token = request_id.current.set(rid)
    try:
        access_log.warning(ACCESS_FORMAT, status, method, path, client, 1000.0 * (time.monotonic() - started))
    finally:
        request_id.current.reset(token)


class HeadLimitStream(IOStream):
    """A connection's stream that answers 431 before it closes for a head past the limit.

    HTTP1Connection reads the head with `read_until_regex(..., max_bytes=max_header_size)`
    (and nothing else with a regex); past the limit the stream closes itself with an
    UnsatisfiableReadError. The answer goes out first, straight to the socket: nothing of
    this request has been answered, and the answer is small.
    """

    # Slots, not the instance dict: IOStream's own 27 attributes fill CPython's shared-key
    # dict nearly to its limit (30); past it every attribute access of Tornado's stream code
    # on this connection takes the slow path.
    __slots__ = ("_reading_head", "address", "max_header_size", "opened")

    def __init__(self, sock: socket.socket, address: Any, max_header_size: int, **kwargs: Any) -> None:
        super().__init__(sock, **kwargs)
        self.address = address
        self.max_header_size = max_header_size
        self.opened = time.monotonic()
        self._reading_head = False

    def read_until_regex(self, regex: bytes, max_bytes: int | None = None) -> Any:
        self._reading_head = True
        return super().read_until_regex(regex, max_bytes)

    def read_until(self, delimiter: bytes, max_bytes: int | None = None) -> Any:
        self._reading_head = False
        return super().read_until(delimiter, max_bytes)

    def read_bytes(self, num_bytes: int, partial: bool = False) -> Any:
        self._reading_head = False
        return super().read_bytes(num_bytes, partial)

    def close(self, exc_info: Any = False) -> None:
        if isinstance(exc_info, tuple):
            error = exc_info[1]
        elif isinstance(exc_info, BaseException):
            error = exc_info
        else:
            error = sys.exc_info()[1] if exc_info else None
        if (
            isinstance(error, UnsatisfiableReadError) and self._reading_head and not self.closed()
            and not self.writing()
        ):
            self._answer_431()
        super().close(exc_info)

    def _answer_431(self) -> None:
        rid = new_id()
        error = MatrixError(431, M_TOO_LARGE, f"Request headers are larger than {self.max_header_size} bytes")
        headers, body = error_answer(error, rid)
        head = "HTTP/1.1 431 Request Header Fields Too Large\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        try:
            self.socket.send(head.encode("latin-1") + b"\r\n" + body)
        except OSError:
            return  # the client is gone already
        client = str(self.address[0]) if isinstance(self.address, tuple) and self.address else "-"
        log_refusal(431, "-", "-", client, self.opened, rid)


class BodyLimit(httputil.HTTPMessageDelegate):
    """Passes a request on to the application until its body is past `limit`; then answers
    413 itself, stops passing it on, and tells the application the connection is gone."""

    # Made for every request: slots, and only what the common case (no body past the limit) needs.
    __slots__ = ("connection", "inner", "limit", "named_limit", "passed_on", "refused", "size", "start_line",
                 "started")

    def __init__(self, inner: httputil.HTTPMessageDelegate, connection: httputil.HTTPConnection, limit: int,
                 named_limit: int) -> None:
        self.inner = inner
        self.connection = connection
        self.limit = limit
        self.named_limit = named_limit  # what the 413 says: any body refused here is past it too
        self.size = 0
        self.refused = False
        self.passed_on = False
        self.start_line: httputil.RequestStartLine | None = None
        self.started = time.monotonic()

    def headers_received(
        self, start_line: httputil.RequestStartLine | httputil.ResponseStartLine, headers: httputil.HTTPHeaders
    ) -> Any:
        if isinstance(start_line, httputil.RequestStartLine):
            self.start_line = start_line
        # `in` first: HTTPHeaders.get pays a KeyError for the missing header of every GET.
        length = headers["Content-Length"] if "Content-Length" in headers else ""
        if length.isdigit() and int(length) > self.limit:
            self._refuse()
            return None
        self.passed_on = True
        return self.inner.headers_received(start_line, headers)

    def data_received(self, chunk: bytes) -> Any:
        if self.refused:
            return None
        self.size += len(chunk)
        if self.size > self.limit:
            self._refuse()
            self.inner.on_connection_close()
            return None
        return self.inner.data_received(chunk)

    def finish(self) -> None:
        if not self.refused:
            self.inner.finish()

    def on_connection_close(self) -> None:
        if not self.refused and self.passed_on:
            self.inner.on_connection_close()

    def _refuse(self) -> None:
        self.refused = True
        rid = new_id()
        headers, body = error_answer(too_large(self.named_limit), rid)
        self.connection.write_headers(
            httputil.ResponseStartLine("HTTP/1.1", 413, "Content Too Large"), httputil.HTTPHeaders(headers), body
        )
        self.connection.finish()  # Tornado closes the connection after it: the body was not read
        method, path = (self.start_line.method, scrub_uri(self.start_line.path)) if self.start_line else ("-", "-")
        context = getattr(self.connection, "context", None)
        log_refusal(413, method, path, getattr(context, "remote_ip", "-"), self.started, rid)


class Server(HTTPServer):
    """HTTPServer with 431 for a head past `max_header_size` and 413 for a body past
    `max_body_size` (see the module's text). Plain-text connections only."""

    def initialize(self, request_callback: Any, *, max_header_size: int | None = None,  # type: ignore[override]
                   max_body_size: int | None = None, named_body_size: int | None = None, **kwargs: Any) -> None:
        """`named_body_size`: the limit a 413's text names (`[server] max_body_size`, which
        the handlers that take a body enforce), at most `max_body_size`."""
        self.head_limit = max_header_size or 65536  # Tornado's default
        self.body_limit = max_body_size or 100 * 1024 * 1024  # Tornado's default
        self.named_body_size = min(named_body_size or self.body_limit, self.body_limit)
        super().initialize(request_callback, max_header_size=self.head_limit, max_body_size=UNBOUNDED, **kwargs)

    def handle_stream(self, stream: IOStream, address: tuple[Any, ...]) -> None:
        # Tornado made the stream; nothing has read or written it yet, so it is made again
        # as the one that answers 431 (the first one is dropped unused).
        if self.ssl_options is None:
            stream = HeadLimitStream(stream.socket, address, self.head_limit, max_buffer_size=self.max_buffer_size,
                                     read_chunk_size=self.read_chunk_size)
        super().handle_stream(stream, address)

    def start_request(
        self, server_conn: object, request_conn: httputil.HTTPConnection
    ) -> httputil.HTTPMessageDelegate:
        return BodyLimit(super().start_request(server_conn, request_conn), request_conn, self.body_limit,
                         self.named_body_size)
