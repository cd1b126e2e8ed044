"""The server's log handler: access lines made without a LogRecord are the lines logging
would make, and lines written on the event loop go out together, in order, nothing lost."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from homeserver import logs, request_id
from homeserver.logs import ACCESS_FORMAT, JsonFormatter, ServerLogHandler, access_log, text_formatter
from tests.backends.redis_servers import free_port, wait_until
from tests.servers import ROOT, call, write_config

ARGS = [
    (200, "GET", "/_matrix/client/versions", "127.0.0.1", 0.4567),
    (401, "GET", "/_matrix/client/v3/account/whoami?access_token=redacted", "::1", 12.0),
    (404, "POST", "/nowhere/ünïcode \"quoted\"", "203.0.113.9", 1234.5),
    (503, "GET", "/health/ready", "198.51.100.1", 0.0),
]


class CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)


@contextlib.contextmanager
def installed():
    """A ServerLogHandler installed as setup_logging installs it: root's only handler (pytest's
    own capture set aside meanwhile), on a stream that counts its writes."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, logs._server_handler)
    stream = CountingStream()
    handler = ServerLogHandler(text_formatter())
    handler.setStream(stream)
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    logs._server_handler = handler
    try:
        yield handler, stream
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logs._server_handler = saved[2]


@pytest.mark.parametrize("formatter", [text_formatter(), JsonFormatter()], ids=["text", "json"])
@pytest.mark.parametrize("args", ARGS)
@pytest.mark.parametrize("level", [logging.INFO, logging.WARNING, logging.ERROR])
def test_a_direct_access_line_is_what_the_formatter_makes_of_the_record(formatter, args, level):
    handler = ServerLogHandler(formatter)
    token = request_id.current.set("0123456789abcdef")
    try:
        record = access_log.makeRecord(access_log.name, level, "(access log)", 0, ACCESS_FORMAT, args, None)
        assert handler.filter(record)
        direct = formatter.format_access(record.created, record.msecs, level, request_id.current.get(), args)
    finally:
        request_id.current.reset(token)
    assert direct == formatter.format(record)


@pytest.mark.parametrize("now", [1_700_000_000.0, 1_700_000_000.999, 1_700_000_001.5, 1_764_000_000.0625])
def test_record_time_is_what_a_log_record_holds(monkeypatch, now):
    monkeypatch.setattr(time, "time", lambda: now)
    monkeypatch.setattr(time, "time_ns", lambda: int(now * 1e9))
    record = logging.makeLogRecord({})
    assert logs.record_time() == (record.created, record.msecs)


def test_access_lines_go_direct_only_while_this_handler_alone_would_get_them():
    with installed() as (handler, _):
        check_direct_only_alone(handler)


def check_direct_only_alone(handler: ServerLogHandler) -> None:
    assert handler.takes_access_lines(logging.INFO)
    root = logging.getLogger()
    other = logging.StreamHandler(io.StringIO())
    for add, remove in [
        (lambda: root.addHandler(other), lambda: root.removeHandler(other)),
        (lambda: access_log.addHandler(other), lambda: access_log.removeHandler(other)),
        (lambda: setattr(access_log, "propagate", False), lambda: setattr(access_log, "propagate", True)),
        (lambda: access_log.addFilter(other), lambda: access_log.removeFilter(other)),
        (lambda: handler.addFilter(lambda r: True), lambda: handler.filters.pop()),
        (lambda: handler.setLevel(logging.WARNING), lambda: handler.setLevel(logging.NOTSET)),
        (lambda: handler.setFormatter(logging.Formatter()), lambda: handler.setFormatter(text_formatter())),
        (lambda: handler.setFormatter(logs.TextFormatter("%(message)s")), lambda: handler.setFormatter(text_formatter())),
        (lambda: handler.setFormatter(logs.TextFormatter(logs.TEXT_FORMAT, "%H:%M")),
         lambda: handler.setFormatter(text_formatter())),
        (lambda: handler.filters.__setitem__(0, logging.Filter()),
         lambda: handler.filters.__setitem__(0, logs.RequestIdFilter())),
    ]:
        add()
        try:
            assert not handler.takes_access_lines(logging.INFO)
        finally:
            remove()
        assert handler.takes_access_lines(logging.INFO)


def test_with_a_capture_beside_it_access_lines_are_records_again():
    with installed() as (_, stream):
        check_capture_beside(stream)


def check_capture_beside(stream: CountingStream) -> None:
    captured: list[logging.LogRecord] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            captured.append(record)

    capture = Capture()
    logging.getLogger().addHandler(capture)
    try:
        logs.log_request(FakeHandler(200))
    finally:
        logging.getLogger().removeHandler(capture)
    assert [r.args[:3] for r in captured] == [(200, "GET", "/_matrix/client/versions")]
    assert "200 GET /_matrix/client/versions 127.0.0.1" in stream.getvalue()


class FakeRequest:
    method = "GET"
    uri = "/_matrix/client/versions"
    remote_ip = "127.0.0.1"

    def request_time(self) -> float:
        return 0.0005


class FakeHandler:
    def __init__(self, status: int) -> None:
        self.status = status
        self.request = FakeRequest()

    def get_status(self) -> int:
        return self.status


async def test_lines_written_on_the_loop_go_out_once_per_turn_in_order():
    with installed() as (handler, stream):
        await check_gathering(handler, stream)


async def check_gathering(handler: ServerLogHandler, stream: CountingStream) -> None:
    handler.gather_on(asyncio.get_running_loop())
    try:
        logs.log_request(FakeHandler(200))
        logging.getLogger("homeserver.test").warning("between")
        logs.log_request(FakeHandler(404))
        assert stream.writes == []  # not yet: the rest of this turn may add more
        await asyncio.sleep(0)
        assert len(stream.writes) == 1
        lines = stream.writes[0].splitlines()
        assert [line.split("]: ", 1)[1] for line in lines] == [
            "200 GET /_matrix/client/versions 127.0.0.1 0.50ms", "between", "404 GET /_matrix/client/versions 127.0.0.1 0.50ms"
        ]

        # Another thread writes at once, after what this turn has gathered: the order holds.
        logs.log_request(FakeHandler(201))
        thread = threading.Thread(target=lambda: logging.getLogger("homeserver.test").warning("from a thread"))
        thread.start()
        thread.join()
        assert stream.writes[1].splitlines()[0].endswith("201 GET /_matrix/client/versions 127.0.0.1 0.50ms")
        assert stream.writes[1].splitlines()[1].endswith("from a thread")

        # A flush (logging.shutdown() at exit calls it) and the end of gathering write what waits.
        logs.log_request(FakeHandler(202))
        handler.flush()
        assert stream.getvalue().splitlines()[-1].endswith("202 GET /_matrix/client/versions 127.0.0.1 0.50ms")
        logs.log_request(FakeHandler(203))
    finally:
        handler.gather_on(None)
    assert stream.getvalue().splitlines()[-1].endswith("203 GET /_matrix/client/versions 127.0.0.1 0.50ms")
    await asyncio.sleep(0)  # the callback the last line scheduled finds nothing left to write
    assert stream.getvalue().count("203 GET") == 1


def test_without_a_loop_every_line_is_written_at_once():
    with installed() as (_, stream):
        logs.log_request(FakeHandler(200))
    assert len(stream.writes) == 1 and "200 GET" in stream.writes[0]


ACCESS_TEXT = re.compile(
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} \[(\d+)\] (INFO|WARNING) homeserver\.access \[([0-9a-f]{16})\]: "
    r"(\d{3}) GET (\S+) 127\.0\.0\.1 \d+\.\d\dms"
)


def fetch_id(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, resp.headers["X-Request-ID"]
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.headers["X-Request-ID"]


@pytest.mark.parametrize("fmt, processes", [("text", 1), ("json", 1), ("text", 2)])
def test_a_running_server_writes_one_access_line_per_request(tmp_path, fmt, processes):
    """run.py's own logging: every request's line, with its ID, its worker's pid, nothing else lost."""
    config = write_config(tmp_path, f"[server]\nprocesses = {processes}\n")
    text = Path(config).read_text().replace('level = "WARNING"\n', f'level = "INFO"\nformat = "{fmt}"\n')
    Path(config).write_text(text)
    port = free_port()
    err = tmp_path / "stderr"
    with open(err, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "run.py", "--config", config, "--port", str(port)], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        wait_until(lambda: call(port, "/health")[0] == 200, 20, "server")
        sent = [(*fetch_id(port, path), path) for path in
                ["/_matrix/client/versions", "/nowhere", "/_matrix/client/v3/account/whoami?access_token=x"] * 5]
    finally:
        proc.terminate()
        proc.wait(20)
    lines = err.read_text().splitlines()
    by_id: dict[str, list[tuple[int, str, int]]] = {}
    for line in lines:
        if fmt == "json":
            entry = json.loads(line)
            if entry["logger"] == "homeserver.access":
                assert list(entry)[:6] == ["time", "level", "logger", "pid", "message", "request_id"]
                by_id.setdefault(entry["request_id"], []).append((entry["status"], entry["path"], entry["pid"]))
        elif (match := ACCESS_TEXT.fullmatch(line)) is not None:
            by_id.setdefault(match[3], []).append((int(match[4]), match[5], int(match[1])))
    for status, rid, path in sent:
        (logged,) = by_id[rid]
        assert logged[:2] == (status, path.replace("access_token=x", "access_token=redacted"))
        if processes > 1:
            assert logged[2] != proc.pid  # a worker's line names the worker
