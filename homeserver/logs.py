"""Logging set-up and the access log, which never shows an access token."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
import time
from datetime import UTC, datetime
from typing import Any, TextIO
from urllib.parse import parse_qsl, urlencode

from homeserver import request_id
from homeserver.request_id import RequestIdFilter

access_log = logging.getLogger("homeserver.access")
# The access line's message; its args, in order, as the JSON format names them.
ACCESS_FORMAT = "%d %s %s %s %.2fms"
ACCESS_FIELDS = ("status", "method", "path", "client", "duration_ms")
TEXT_FORMAT = "%(asctime)s [%(process)d] %(levelname)s %(name)s [%(request_id)s]: %(message)s"

SECRET_PARAMS = frozenset({"access_token", "token", "password", "user_code", "device_code"})


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
    args = (
        status,
        request.method,
        scrub_uri(request.uri or ""),
        getattr(handler, "client_ip", None) or request.remote_ip,
        1000.0 * request.request_time(),
    )
    writer = _server_handler
    if writer is not None and writer.takes_access_lines(level) and writer.access_line(level, args):
        return
    # makeRecord + handle is what Logger.log does, minus findCaller's stack walk (a third
    # of the cost of a line); no access format shows the caller.
    access_log.handle(access_log.makeRecord(access_log.name, level, "(access log)", 0, ACCESS_FORMAT, args, None))


if sys.version_info >= (3, 13):

    def record_time() -> tuple[float, float]:
        """`created` and `msecs` of a record made now, computed as this Python's LogRecord does."""
        ns = time.time_ns()
        return ns / 1e9, (ns % 1_000_000_000) // 1_000_000 + 0.0

else:

    def record_time() -> tuple[float, float]:
        """`created` and `msecs` of a record made now, computed as this Python's LogRecord does."""
        now = time.time()
        return now, int((now - int(now)) * 1000) + 0.0


_pid = os.getpid()


def _forked() -> None:
    global _pid
    _pid = os.getpid()


# A forked worker's lines name its own process, as LogRecord's os.getpid() would.
os.register_at_fork(after_in_child=_forked)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, pid, message, and an access line's fields."""

    formats_access_lines = True

    @staticmethod
    def _entry(created: float, level: str, name: str, pid: int | None, message: str, rid: str) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds"),
            "level": level,
            "logger": name,
            "pid": pid,
            "message": message,
        }
        if rid != "-":
            entry["request_id"] = rid
        return entry

    def format(self, record: logging.LogRecord) -> str:
        entry = self._entry(
            record.created, record.levelname, record.name, record.process, record.getMessage(),
            getattr(record, "request_id", "-"),
        )
        fields = getattr(record, "audit", None)
        if isinstance(fields, dict):  # homeserver.audit: the event's fields, each its own key
            entry.update(fields)
        if record.name == access_log.name and isinstance(record.args, tuple) and len(record.args) == len(ACCESS_FIELDS):
            entry.update(zip(ACCESS_FIELDS, record.args, strict=True))
            entry["duration_ms"] = round(entry["duration_ms"], 2)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)

    def format_access(self, created: float, msecs: float, levelno: int, rid: str, args: tuple[Any, ...]) -> str:
        """What format() gives for an access line's record with these values."""
        entry = self._entry(created, logging.getLevelName(levelno), access_log.name, _pid, ACCESS_FORMAT % args, rid)
        entry.update(zip(ACCESS_FIELDS, args, strict=True))
        entry["duration_ms"] = round(entry["duration_ms"], 2)
        return json.dumps(entry, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """The text format; the time of day is formatted once a second (it starts every access line)."""

    _second: int = -1
    _text: str = ""

    @property
    def formats_access_lines(self) -> bool:
        """format_access() makes this formatter's lines: the server's format, the standard time."""
        return self._fmt == TEXT_FORMAT and self.datefmt is None and isinstance(self._style, logging.PercentStyle)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        return self._time(record.created, record.msecs)

    def _time(self, created: float, msecs: float) -> str:
        second = int(created)
        if second != self._second:
            self._second, self._text = second, time.strftime(self.default_time_format, self.converter(created))
        return (self.default_msec_format or "%s,%03d") % (self._text, msecs)

    def format_access(self, created: float, msecs: float, levelno: int, rid: str, args: tuple[Any, ...]) -> str:
        """What format() gives, with TEXT_FORMAT, for an access line's record with these values."""
        level = logging.getLevelName(levelno)
        return f"{self._time(created, msecs)} [{_pid}] {level} {access_log.name} [{rid}]: {ACCESS_FORMAT % args}"


def text_formatter() -> TextFormatter:
    return TextFormatter(TEXT_FORMAT)


class ServerLogHandler(logging.StreamHandler[TextIO]):
    """The server's log handler, on standard error.

    Two savings on the request path, the output unchanged:
    - lines written on the event loop's thread (every access line) are gathered and
      written together once per turn of the loop (`gather_writes`): one write() for all
      the requests a turn finished instead of one each. Any other thread writes at once,
      after whatever is gathered, so the order holds; a flush (at exit too) writes it all;
    - access lines skip the LogRecord (`access_line`) while this handler is the only one
      they would reach and its formatter is one of ours: the same text, made directly.
      With any other handler or filter on their way (a test's capture, say), they go
      through logging as every other line does.
    """

    def __init__(self, formatter: logging.Formatter) -> None:
        super().__init__()
        self.setFormatter(formatter)
        # Every line written while serving a request carries its ID ("-" outside requests).
        self.addFilter(RequestIdFilter())
        self._pending: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None

    def gather_on(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Gather the lines `loop`'s thread writes (this thread's), or, with None, stop and write them."""
        self.acquire()
        try:
            self._write_pending()
            self._loop = loop
            self._thread = threading.get_ident() if loop is not None else None
        finally:
            self.release()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._write(self.format(record) + self.terminator)
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)

    def takes_access_lines(self, level: int) -> bool:
        """True when an access line at `level` would reach this handler, and only it, unchanged."""
        filters = self.filters
        if level < self.level or len(filters) != 1 or not isinstance(filters[0], RequestIdFilter):
            return False
        if not getattr(self.formatter, "formats_access_lines", False):
            return False
        logger: logging.Logger | None = access_log
        if access_log.filters or access_log.disabled:
            return False
        while logger is not None:
            if logger.handlers:
                return logger.parent is None and len(logger.handlers) == 1 and logger.handlers[0] is self
            if not logger.propagate:
                return False
            logger = logger.parent
        return False

    def access_line(self, level: int, args: tuple[Any, ...]) -> bool:
        """Write an access line as format() would write its record (see takes_access_lines);
        False when it could not be made (the caller then logs it the usual way)."""
        created, msecs = record_time()
        try:
            line = self.formatter.format_access(created, msecs, level, request_id.current.get(), args)  # type: ignore[union-attr]
        except Exception:
            return False
        self.acquire()
        try:
            self._write(line + self.terminator)
        except Exception:
            self.handleError(logging.makeLogRecord({"msg": line}))
        finally:
            self.release()
        return True

    def _write(self, text: str) -> None:
        """Write `text` now, or with the rest of this turn of the loop (the lock is held)."""
        loop = self._loop
        if loop is not None and threading.get_ident() == self._thread and not loop.is_closed():
            if not self._pending:
                loop.call_soon(self._flush_pending)
            self._pending.append(text)
            return
        if self._pending:
            text = "".join(self._pending) + text
            self._pending.clear()
        self.stream.write(text)
        self.stream.flush()

    def _flush_pending(self) -> None:
        self.acquire()
        try:
            self._write_pending()
        except Exception:  # nowhere left to report a failing standard error
            pass
        finally:
            self.release()

    def _write_pending(self) -> None:
        if self._pending:
            text = "".join(self._pending)
            self._pending.clear()
            self.stream.write(text)
            self.stream.flush()

    def flush(self) -> None:
        self.acquire()
        try:
            self._write_pending()
            super().flush()
        finally:
            self.release()


# The handler setup_logging installed (None until then, and in tests that log elsewhere).
_server_handler: ServerLogHandler | None = None


def gather_writes(loop: asyncio.AbstractEventLoop | None) -> None:
    """Gather the server handler's lines per turn of `loop` (see ServerLogHandler); None stops."""
    if _server_handler is not None:
        _server_handler.gather_on(loop)


# Where a command run at a terminal sends its audit lines: the system log (journald or rsyslog).
SYSLOG_SOCKET = "/dev/log"


def setup_cli_logging(level: str, fmt: str = "text") -> None:
    """Logging for a one-shot command: warnings on standard error; its audit lines
    (homeserver.audit) in the log, not on the terminal: at a terminal, the system log
    (facility authpriv, tag `homeserver`) when there is one; otherwise (run by a script, a
    unit, a test) standard error in the configured format, where that caller keeps it.
    Nothing when the process already logs somewhere (the command run inside another program)."""
    if logging.getLogger().handlers:
        return
    quiet = max(getattr(logging, level, logging.INFO), logging.WARNING)
    setup_logging(logging.getLevelName(quiet), fmt)
    audit_logger = logging.getLogger("homeserver.audit")
    audit_logger.setLevel(logging.INFO)
    handler = _system_log(fmt) if sys.stderr.isatty() else None
    if handler is not None:
        audit_logger.addHandler(handler)
        audit_logger.propagate = False


def _system_log(fmt: str) -> logging.Handler | None:
    """A handler writing to the system log, or None when there is none (a container)."""
    from logging.handlers import SysLogHandler

    try:
        handler = SysLogHandler(SYSLOG_SOCKET, facility=SysLogHandler.LOG_AUTHPRIV)
    except OSError:
        return None
    handler.ident = "homeserver: "
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter("%(message)s"))
    return handler


def setup_logging(level: str, fmt: str = "text") -> None:
    """Log to stderr at `level`, as text lines or one JSON object per line."""
    global _server_handler
    handler = ServerLogHandler(JsonFormatter() if fmt == "json" else text_formatter())
    _server_handler = handler
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level, logging.INFO))
