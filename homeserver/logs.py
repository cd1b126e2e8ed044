"""Logging set-up and the access log, which never shows an access token."""

from __future__ import annotations

import asyncio
import json
import logging
import logging.handlers
import socket
import sys
import threading
import time
from datetime import UTC, datetime
from typing import Any, TextIO
from urllib.parse import parse_qsl, urlencode

from homeserver.request_id import RequestIdFilter

access_log = logging.getLogger("homeserver.access")
# The access line's message; its args, in order, as the JSON format names them.
ACCESS_FORMAT = "%d %s %s %s %.2fms"
ACCESS_FIELDS = ("status", "method", "path", "client", "duration_ms")
TEXT_FORMAT = "%(asctime)s [%(process)d] %(levelname)s %(name)s [%(request_id)s]: %(message)s"

# Query parameters whose values are secrets (tokens, codes, passwords) or personal (a login
# hint is a name or an e-mail address): never written to the access log. The OAuth ones
# (RFC 6749, 7636, 8628, OpenID Connect) belong in a body, but a client may send them in a URL.
SECRET_PARAMS = frozenset({
    "access_token", "token", "password", "loginToken",
    "refresh_token", "code", "code_verifier", "client_secret", "client_assertion", "assertion",
    "id_token_hint", "login_hint", "device_code", "user_code",
})


def scrub_uri(uri: str, *, nested: bool = True) -> str:
    """Return the request URI with secret query values replaced by 'redacted': its own, and
    those of a value that is itself an address with a query, one level down (the second
    step's `then`, the page it returns to: `/account/device?user_code=...`)."""
    path, sep, query = uri.partition("?")
    if not sep:
        return path
    pairs = parse_qsl(query, keep_blank_values=True)
    scrubbed = [
        (n, "redacted" if n in SECRET_PARAMS else scrub_uri(v, nested=False) if nested and "?" in v else v)
        for n, v in pairs
    ]
    if scrubbed == pairs:
        return uri
    return path + "?" + urlencode(scrubbed)


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
    # makeRecord + handle is what Logger.log does, minus findCaller's stack walk (a third
    # of the cost of a line); no access format shows the caller.
    access_log.handle(access_log.makeRecord(access_log.name, level, "(access log)", 0, ACCESS_FORMAT, args, None))


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
    return TextFormatter(TEXT_FORMAT)


class LoopTurnHandler(logging.handlers.MemoryHandler):
    """The server's log handler: records kept in memory and handed to `target` (standard
    error, in the configured format) once per turn of the event loop.

    Synapse's PeriodicallyFlushingMemoryHandler with the period one turn of the loop: the
    records logged on the loop's thread (every access line) go out together, formatted by
    the target and written with one write() for all the requests the turn finished. A
    record from any other thread, one at ERROR or above, a full buffer, or a flush (at
    exit too: logging.shutdown) writes everything waiting at once, so the order holds and
    nothing is lost. Without a loop (`gather_on(None)`, one-shot commands) every record is
    written as it comes.
    """

    def __init__(self, target: logging.StreamHandler[TextIO], capacity: int = 1000) -> None:
        super().__init__(capacity, flushLevel=logging.ERROR, target=target, flushOnClose=True)
        # Every line written while serving a request carries its ID ("-" outside requests):
        # set here, when the record is logged, not when it is written.
        self.addFilter(RequestIdFilter())
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None

    def gather_on(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Keep the records `loop`'s thread (this thread) logs until the turn ends; None: no more."""
        self.acquire()
        try:
            self.flush()
            self._loop = loop
            self._thread = threading.get_ident() if loop is not None else None
        finally:
            self.release()

    def shouldFlush(self, record: logging.LogRecord) -> bool:
        if super().shouldFlush(record):
            return True
        loop = self._loop
        if loop is None or threading.get_ident() != self._thread or loop.is_closed():
            return True
        if len(self.buffer) == 1:  # the turn's first record: write them all when it ends
            loop.call_soon(self.flush)
        return False

    def flush(self) -> None:
        """Format what waits with the target's formatter and write it in one piece."""
        self.acquire()
        try:
            target = self.target
            if not self.buffer or not isinstance(target, logging.StreamHandler):
                return
            records, self.buffer = self.buffer, []
            lines = []
            for record in records:
                try:
                    if target.filter(record):
                        lines.append(target.format(record) + target.terminator)
                except Exception:
                    target.handleError(record)
            target.acquire()
            try:
                target.stream.write("".join(lines))
                target.flush()
            except Exception:
                target.handleError(records[-1])
            finally:
                target.release()
        finally:
            self.release()


# The handler setup_logging installed (None until then, and in tests that log elsewhere).
_server_handler: LoopTurnHandler | None = None


def gather_writes(loop: asyncio.AbstractEventLoop | None) -> None:
    """Write the server handler's lines once per turn of `loop` (see LoopTurnHandler); None stops."""
    if _server_handler is not None:
        _server_handler.gather_on(loop)


# Where a command run at a terminal sends its audit lines: the system log (journald or rsyslog).
SYSLOG_SOCKET = "/dev/log"


def setup_cli_logging(level: str, fmt: str = "text") -> None:
    """Logging for a one-shot command: warnings on standard error; its audit lines
    (homeserver.audit) in the log, not on the terminal: at a terminal, the system log
    (facility authpriv, tag `homeserver`) when one listens; otherwise (no system log, as in
    a container; run by a script, a unit, a test) standard error in the configured format,
    where that caller keeps it. Never a logging traceback.
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
    """A handler writing to the system log, or None when nothing listens there (no `/dev/log`:
    a container, a minimal system). SysLogHandler itself does not say so: it is made without
    a connection and prints a traceback at its first line, so the socket is tried here first."""
    if not _system_log_listens(SYSLOG_SOCKET):
        return None
    handler = _SystemLog(SYSLOG_SOCKET, facility=logging.handlers.SysLogHandler.LOG_AUTHPRIV)
    handler.ident = "homeserver: "
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter("%(message)s"))
    return handler


def _system_log_listens(address: str) -> bool:
    for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):  # as SysLogHandler tries them
        with socket.socket(socket.AF_UNIX, kind) as sock:
            try:
                sock.connect(address)
            except OSError:
                continue
            return True
    return False


class _SystemLog(logging.handlers.SysLogHandler):
    """The system log; a line it cannot take (the daemon went away) goes where the command's
    other lines go (the root logger's handlers: standard error) instead of a logging traceback."""

    def handleError(self, record: logging.LogRecord) -> None:
        for handler in logging.getLogger().handlers:
            handler.handle(record)


def setup_logging(level: str, fmt: str = "text") -> None:
    """Log to stderr at `level`, as text lines or one JSON object per line."""
    global _server_handler
    # Neither format shows a thread's or a process's name: logging's own switches spare
    # every record (an access line per request) looking them up.
    logging.logThreads = False
    logging.logMultiprocessing = False
    stream = logging.StreamHandler(sys.stderr)
    stream.setFormatter(JsonFormatter() if fmt == "json" else text_formatter())
    handler = LoopTurnHandler(stream)
    _server_handler = handler
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level, logging.INFO))
