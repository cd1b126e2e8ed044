"""The base handler's own clear(): Tornado's headers, same order, a valid per-second Date."""

from __future__ import annotations

import email.utils
import time

import tornado


async def test_server_and_date_headers(fetch):
    resp = await fetch("/_matrix/client/versions")
    assert resp.headers["Server"] == f"TornadoServer/{tornado.version}"
    date = email.utils.parsedate_to_datetime(resp.headers["Date"])
    assert abs(date.timestamp() - time.time()) < 5
    names = [name for name, _ in resp.headers.get_all()]
    assert names[:3] == ["Server", "Content-Type", "Date"]


async def test_error_responses_keep_json_and_cors(fetch):
    resp = await fetch("/nowhere")
    assert resp.status == 404
    assert resp.headers["Content-Type"] == "application/json"
    assert resp.headers["Access-Control-Allow-Origin"] == "*"
    assert resp.headers["Server"].startswith("TornadoServer/")
