"""The access log: one line per request, structured fields, never a token or a password."""

from __future__ import annotations

import json
import logging

import pytest

from homeserver import logs
from homeserver.logs import JsonFormatter, setup_logging
from tests.support.helpers import assert_json

LOGIN = "/_matrix/client/v3/login"


def access_records(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "homeserver.access"]


async def test_access_line_never_shows_secrets(fetch, login, caplog):
    caplog.set_level(logging.INFO)
    token = (await login())["access_token"]
    assert_json(await fetch("/_matrix/client/v3/account/whoami?access_token=" + token))
    assert_json(await fetch("/_matrix/client/v3/account/whoami", token=token))
    everything = "\n".join(JsonFormatter().format(r) for r in caplog.records)
    assert token not in everything
    assert token.split(".")[2] not in everything  # not even the signature
    assert "wonderland" not in everything
    assert "access_token=redacted" in everything
    fields = json.loads(JsonFormatter().format(access_records(caplog)[-1]))
    assert fields["method"] == "GET" and fields["status"] == 200 and fields["client"] == "127.0.0.1"
    assert fields["path"] == "/_matrix/client/v3/account/whoami" and fields["duration_ms"] >= 0


async def test_uncaught_errors_do_not_log_the_token(fetch, caplog, backend, monkeypatch):
    async def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(backend, "get_user", broken)
    resp = await fetch("/_matrix/client/v3/profile/@alice:localhost?access_token=sekrit-token")
    assert resp.status == 500
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors and all("sekrit-token" not in r.getMessage() for r in errors)


class TestTrustedProxyClient:
    @pytest.fixture
    def config_overrides(self):
        return {"server": {"trusted_proxies": ["127.0.0.1"]}}

    async def test_client_address_from_forwarded_for(self, fetch, caplog):
        caplog.set_level(logging.INFO)
        await fetch("/_matrix/client/versions", headers={"X-Forwarded-For": "198.51.100.1, 203.0.113.9"})
        assert access_records(caplog)[-1].args[3] == "203.0.113.9"
        await fetch("/_matrix/client/versions", headers={"X-Forwarded-For": "not-an-ip"})
        assert access_records(caplog)[-1].args[3] == "127.0.0.1"


def test_json_format_is_one_object_per_line():
    args = (200, "GET", "/x", "1.2.3.4", 0.456)
    record = logging.LogRecord("homeserver.access", logging.INFO, __file__, 1, "%d %s %s %s %.2fms", args, None)
    line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == "200 GET /x 1.2.3.4 0.46ms" and entry["level"] == "INFO"
    assert (entry["status"], entry["method"], entry["path"], entry["client"], entry["duration_ms"]) == (
        200, "GET", "/x", "1.2.3.4", 0.46
    )
    assert entry["time"].endswith("+00:00")


def test_json_format_carries_exceptions():
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    entry = json.loads(JsonFormatter().format(record))
    assert "ValueError" in entry["exception"]


def test_setup_logging_replaces_handlers(capsys):
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, logs._server_handler)
    try:
        setup_logging("WARNING", "json")
        assert root.handlers == [logs._server_handler] and root.level == logging.WARNING
        logging.getLogger("homeserver.test").info("not at WARNING")
        logging.getLogger("homeserver.test").warning("one %s", "line")
        root.handlers[0].close()  # what logging.shutdown() does at exit: writes what waits
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logs._server_handler = saved[2]
    (line,) = capsys.readouterr().err.splitlines()
    entry = json.loads(line)
    assert (entry["level"], entry["logger"], entry["message"]) == ("WARNING", "homeserver.test", "one line")


def test_text_format_time_is_the_standard_one():
    """The per-second time cache gives exactly what logging.Formatter gives."""
    import logging as _logging

    from homeserver.logs import TextFormatter

    fmt = "%(asctime)s %(message)s"
    for created in (1_700_000_000.0, 1_700_000_000.999, 1_700_000_001.5, 1_700_000_000.25):
        record = _logging.LogRecord("x", _logging.INFO, "", 0, "m", None, None)
        record.created, record.msecs = created, (created - int(created)) * 1000
        assert TextFormatter(fmt).format(record) == _logging.Formatter(fmt).format(record)
