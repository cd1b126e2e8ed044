"""The server's log handler: lines logged on the event loop go out once per turn, exactly as
a plain StreamHandler would write them, in order, nothing lost (at exit too)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import re
import subprocess
import sys
import textwrap
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from homeserver import logs, request_id
from homeserver.logs import JsonFormatter, LoopTurnHandler, RequestIdFilter, text_formatter
from tests.support.redis_servers import free_port, wait_until
from tests.support.servers import ROOT, call, write_config


class CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)


@contextlib.contextmanager
def installed(formatter: logging.Formatter | None = None):
    """A LoopTurnHandler installed as setup_logging installs it: root's only handler (pytest's
    own capture set aside meanwhile), writing to a stream that counts its writes."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, logs._server_handler)
    stream = CountingStream()
    target = logging.StreamHandler(stream)
    target.setFormatter(formatter or text_formatter())
    handler = LoopTurnHandler(target)
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    logs._server_handler = handler
    try:
        yield handler, stream
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logs._server_handler = saved[2]


class FakeRequest:
    method = "GET"
    uri = "/_matrix/client/versions"
    remote_ip = "127.0.0.1"

    def request_time(self) -> float:
        return 0.0005


class FakeHandler:
    def __init__(self, status: int, uri: str = "/_matrix/client/versions") -> None:
        self.status = status
        self.request = FakeRequest()
        self.request.uri = uri

    def get_status(self) -> int:
        return self.status


def log_a_mix(name: str) -> None:
    """Access lines of every level, with and without a request ID, a line with an exception."""
    token = request_id.current.set("0123456789abcdef")
    try:
        logs.log_request(FakeHandler(200))
        logs.log_request(FakeHandler(401, "/_matrix/client/v3/account/whoami?access_token=secret"))
        logging.getLogger("homeserver.test").warning("inside %s", name)
    finally:
        request_id.current.reset(token)
    logs.log_request(FakeHandler(404, '/nowhere/ünïcode "quoted"'))
    logs.log_request(FakeHandler(503, "/health/ready"))
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        logging.getLogger("homeserver.test").exception("with a traceback")


@pytest.mark.parametrize("formatter", [text_formatter, JsonFormatter], ids=["text", "json"])
async def test_lines_are_what_a_plain_stream_handler_writes(formatter):
    """Gathered and written later, every line is the text logging's own StreamHandler makes
    of the record at once (the request ID as it was when the line was logged)."""
    with installed(formatter()) as (handler, stream):
        plain_stream = io.StringIO()
        plain = logging.StreamHandler(plain_stream)
        plain.setFormatter(formatter())
        plain.addFilter(RequestIdFilter())
        logging.getLogger().addHandler(plain)
        try:
            handler.gather_on(asyncio.get_running_loop())
            log_a_mix("the loop")
            thread = threading.Thread(target=log_a_mix, args=("a thread",))
            thread.start()
            thread.join()
            log_a_mix("the loop again")
            await asyncio.sleep(0)
        finally:
            handler.gather_on(None)
            logging.getLogger().removeHandler(plain)
    assert stream.getvalue() == plain_stream.getvalue()
    assert stream.getvalue().count("0123456789abcdef") == 9
    assert "access_token=redacted" in stream.getvalue() and "secret" not in stream.getvalue()
    assert "ValueError" in stream.getvalue()


async def test_lines_written_on_the_loop_go_out_once_per_turn_in_order():
    with installed() as (handler, stream):
        await check_gathering(handler, stream)


async def check_gathering(handler: LoopTurnHandler, stream: CountingStream) -> None:
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

        # An error goes out at once, with what waits before it.
        logs.log_request(FakeHandler(204))
        logging.getLogger("homeserver.test").error("an error")
        assert stream.writes[2].splitlines()[-2:][0].endswith("204 GET /_matrix/client/versions 127.0.0.1 0.50ms")
        assert stream.writes[2].splitlines()[-1].endswith("an error")

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
        logs.log_request(FakeHandler(201))
    assert len(stream.writes) == 2 and "200 GET" in stream.writes[0] and "201 GET" in stream.writes[1]


def test_a_full_buffer_is_written_without_waiting_for_the_turn():
    with installed() as (handler, stream):
        loop = asyncio.new_event_loop()
        try:
            handler.gather_on(loop)  # this thread's loop, not running: only capacity writes
            for _ in range(handler.capacity):
                logs.log_request(FakeHandler(200))
            assert len(stream.writes) == 1 and stream.writes[0].count("\n") == handler.capacity
        finally:
            handler.gather_on(None)
            loop.close()


def test_what_waits_is_written_when_the_process_exits(tmp_path):
    """Lines gathered on a loop that is never given another turn still reach standard error:
    logging.shutdown() at exit flushes the handler."""
    script = textwrap.dedent("""
        import asyncio, logging
        from homeserver import logs
        logs.setup_logging("INFO", "text")

        async def main():
            logs.gather_writes(asyncio.get_running_loop())
            for n in range(3):
                logging.getLogger("homeserver.test").info("line %d", n)
            raise SystemExit(0)  # before the turn ends

        asyncio.run(main())
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [line.split("]: ", 1)[1] for line in done.stderr.splitlines()] == ["line 0", "line 1", "line 2"]


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
