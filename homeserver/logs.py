"""Logging set-up and the access log, which never shows an access token."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import parse_qsl, urlencode

access_log = logging.getLogger("homeserver.access")

SECRET_PARAMS = frozenset({"access_token", "token", "password"})


def scrub_uri(uri: str) -> str:
    """Return the request URI with secret query values replaced by 'redacted'."""
    path, sep, query = uri.partition("?")
    if not sep:
        return path
    pairs = parse_qsl(query, keep_blank_values=True)
    if not any(name in SECRET_PARAMS for name, _ in pairs):
        return uri
    return path + "?" + urlencode([(n, "redacted" if n in SECRET_PARAMS else v) for n, v in pairs])


def log_request(handler: Any) -> None:
    """One line per finished request: status, method, path, client, duration."""
    status = handler.get_status()
    if status < 400:
        level = logging.INFO
    elif status < 500:
        level = logging.WARNING
    else:
        level = logging.ERROR
    if not access_log.isEnabledFor(level):
        return
    request = handler.request
    # makeRecord + handle is what Logger.log does, minus findCaller's stack walk (a third
    # of the cost of a line); the access format never shows the caller.
    access_log.handle(
        access_log.makeRecord(
            access_log.name,
            level,
            "(access log)",
            0,
            "%d %s %s %s %.2fms",
            (status, request.method, scrub_uri(request.uri), request.remote_ip, 1000.0 * request.request_time()),
            None,
        )
    )


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level, logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
