"""Logging set-up and the access log, which never shows an access token."""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, urlencode

from homeserver.request_id import RequestIdFilter

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
    """One line per finished request: status, method, path (secrets redacted), client, duration.

    The JSON format reads the same values back from the record's args (ACCESS_FIELDS),
    so the text format pays nothing for them. Headers and bodies are never logged, so
    neither are tokens nor passwords.
    """
    status = handler.get_status()
    # A handler may say its answer is expected (readiness 503 during a drain).
    level = getattr(handler, "access_log_level", None)
    if level is None:
        level = logging.INFO if status < 400 else logging.WARNING if status < 500 else logging.ERROR
    if not access_log.isEnabledFor(level):
        return
    request = handler.request
    # makeRecord + handle is what Logger.log does, minus findCaller's stack walk (a third
    # of the cost of a line); no access format shows the caller.
    access_log.handle(
        access_log.makeRecord(
            access_log.name,
            level,
            "(access log)",
            0,
            "%d %s %s %s %.2fms",
            (
                status,
                request.method,
                scrub_uri(request.uri or ""),
                getattr(handler, "client_ip", None) or request.remote_ip,
                1000.0 * request.request_time(),
            ),
            None,
        )
    )


# The access line's args, in order, as the JSON format names them.
ACCESS_FIELDS = ("status", "method", "path", "client", "duration_ms")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, pid, message, and an access line's fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        rid = getattr(record, "request_id", "-")
        if rid != "-":
            entry["request_id"] = rid
        fields = getattr(record, "audit", None)
        if isinstance(fields, dict):  # homeserver.audit: the event's fields, each its own key
            entry.update(fields)
        if record.name == access_log.name and isinstance(record.args, tuple) and len(record.args) == len(ACCESS_FIELDS):
            entry.update(zip(ACCESS_FIELDS, record.args, strict=True))
            entry["duration_ms"] = round(entry["duration_ms"], 2)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """The text format; the time of day is formatted once a second (it starts every access line)."""

    _second: int = -1
    _text: str = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        if second != self._second:
            self._second, self._text = second, time.strftime(self.default_time_format, self.converter(record.created))
        return (self.default_msec_format or "%s,%03d") % (self._text, record.msecs)


def text_formatter() -> TextFormatter:
    return TextFormatter("%(asctime)s [%(process)d] %(levelname)s %(name)s [%(request_id)s]: %(message)s")


def setup_cli_logging(level: str, fmt: str = "text") -> None:
    """Logging for a one-shot command: its audit lines (homeserver.audit) and warnings, on
    standard error in the configured format; nothing when the process already logs
    somewhere (the command run inside another program, or a test)."""
    if logging.getLogger().handlers:
        return
    quiet = max(getattr(logging, level, logging.INFO), logging.WARNING)
    setup_logging(logging.getLevelName(quiet), fmt)
    logging.getLogger("homeserver.audit").setLevel(logging.INFO)


def setup_logging(level: str, fmt: str = "text") -> None:
    """Log to stderr at `level`, as text lines or one JSON object per line."""
    handler = logging.StreamHandler()
    # Every line written while serving a request carries its ID ("-" outside requests).
    handler.addFilter(RequestIdFilter())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(text_formatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level, logging.INFO))
