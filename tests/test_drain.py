"""A drain timeout ends in-flight logins quietly: each gets a 503, the log gets no traceback."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import time

from tests.test_shutdown import start  # noqa: F401  (the `start` fixture)

# bcrypt at cost 15 ("pw"): about two seconds a check here, so the first login is still
# hashing, and the second queued behind it, when the drain times out.
SLOW_HASH = b"$2b$15$1hiUV/EPOsYXG4ujGcfjZePhMg6cRVOTe4XQxKQfoniSyTq9Jg/TC".hex()
LOGIN = {"identifier": {"user": "slow"}, "password": "pw"}


def test_drain_timeout_cuts_off_logins_without_tracebacks(start, monkeypatch):  # noqa: F811
    monkeypatch.setenv("HOMESERVER_AUTH__BCRYPT_WORKERS", "1")  # one check at a time: the second waits
    server = start(drain_timeout=0.2)
    server.users.write_text(json.dumps({"users": [{"name": "slow", "password": SLOW_HASH, "ident": "-s"}]}))
    server.proc.send_signal(signal.SIGHUP)
    server.wait_log("reloaded users file")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        logins = [pool.submit(server.request, "/_matrix/client/v3/login", LOGIN) for _ in range(2)]
        time.sleep(1.0)  # both read and in the login: one hashing, one queued for the pool
        server.proc.send_signal(signal.SIGTERM)
        answers = [login.result(timeout=30) for login in logins]
    assert server.proc.wait(timeout=30) == 0
    assert [status for status, _ in answers] == [503, 503], answers
    log = server.log.read_text()
    assert "shutting down: 2 requests in flight" in log and "2 requests still running; answering them 503" in log, log
    assert "Traceback" not in log and "CancelledError" not in log and "uncaught" not in log, log
