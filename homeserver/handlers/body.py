"""One bounded request-body reader for every handler that takes a body."""

from __future__ import annotations

import logging
import urllib.parse
from typing import Any

from tornado.web import stream_request_body

from homeserver.errors import too_large
from homeserver.handlers.base import BaseHandler
from homeserver.jsonio import decode_json_object

logger = logging.getLogger(__name__)

BODY_METHODS = ("POST", "PUT", "DELETE", "PATCH")
# The most fields a form of ours has (the token endpoint's has six): more is no client of ours.
MAX_FORM_FIELDS = 16


class FormError(ValueError):
    """A body that is no application/x-www-form-urlencoded form: not UTF-8 (`undecodable`), or
    more than MAX_FORM_FIELDS fields."""

    def __init__(self, message: str, *, undecodable: bool = False) -> None:
        super().__init__(message)
        self.undecodable = undecodable


def parse_form(body: bytes) -> dict[str, list[str]]:
    """A form's fields, each with its values in order (blank ones kept); FormError otherwise."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise FormError("the form is not UTF-8", undecodable=True) from None
    try:
        return urllib.parse.parse_qs(text, keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS)
    except ValueError:
        raise FormError(f"a form has at most {MAX_FORM_FIELDS} fields") from None


@stream_request_body
class BodyHandler(BaseHandler):
    """Streams the body so one over `[server] max_body_size` gets 413 M_TOO_LARGE unbuffered.

    A declared Content-Length over the limit is refused before any byte is read; a chunked
    body is counted as it arrives and dropped once over. Subclasses read it with
    `json_body()` (a JSON object or a 400), `form()` (a form's fields) or `body_size()`, or
    ignore it.
    """

    def prepare(self) -> None:
        self._chunks: list[bytes] = []
        self._size = 0
        self._limit = self.hs.max_body_size
        # Tests of the shutdown wait for this line: the request is in flight from here on.
        logger.debug("%s %s: reading the body", self.request.method, self.request.path)
        if self.request.method in BODY_METHODS:
            length = self.request.headers.get("Content-Length", "")
            if length.isdigit() and int(length) > self._limit:
                raise too_large(self._limit)

    def data_received(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size <= self._limit:
            self._chunks.append(chunk)
        else:
            self._chunks.clear()  # chunked and too long: drop it, answer 413 at the end

    def check_body_size(self) -> None:
        """Raise 413 for a (chunked) body that went over the limit."""
        if self._size > self._limit:
            raise too_large(self._limit)

    def body_bytes(self) -> bytes:
        """The body as sent (413 for one over the limit)."""
        self.check_body_size()
        return b"".join(self._chunks)

    def json_body(self, *, optional: bool = False) -> dict[str, Any]:
        """The body as a JSON object; with `optional`, an empty body is `{}`."""
        raw = self.body_bytes()
        if optional and not raw.strip():
            return {}
        return decode_json_object(raw)

    def form(self) -> dict[str, list[str]]:
        """The body as an application/x-www-form-urlencoded form (parse_form; FormError)."""
        return parse_form(self.body_bytes())
