"""Liveness and readiness."""

from __future__ import annotations

import os

import pytest

from homeserver.errors import StoreUnavailable
from tests.support.helpers import assert_error, assert_json


async def test_liveness(fetch):
    body = assert_json(await fetch("/health"))
    assert body == {"status": "ok", "pid": os.getpid()}


async def test_readiness(fetch):
    assert assert_json(await fetch("/health/ready")) == {"status": "ready"}


async def test_not_ready_when_the_store_is_down(fetch, backend, monkeypatch):
    async def down() -> None:
        raise StoreUnavailable("connection refused", retry_after=7)

    monkeypatch.setattr(backend, "check_health", down)
    resp = await fetch("/health/ready")
    assert_error(resp, 503, "M_UNKNOWN")
    assert resp.headers["Retry-After"] == "7"
    assert_json(await fetch("/health"))  # liveness does not depend on the store


async def test_not_ready_while_draining(fetch, app):
    app.settings["homeserver"].inflight.draining = True
    resp = await fetch("/health/ready")
    assert_error(resp, 503, "M_UNKNOWN")
    assert resp.headers["Connection"] == "close"


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
async def test_other_methods(fetch, method):
    assert_error(await fetch("/health", method), 405, "M_UNRECOGNIZED")
