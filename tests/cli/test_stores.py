"""The one way the command-line commands open and close the stores (homeserver/cli/stores.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from backends.file import FileBackend
from homeserver import context
from homeserver.cli import stores as cli_stores
from homeserver.config import build_config
from homeserver.errors import ConfigError
from tests.support.helpers import JWT_SECRET
from tests.support.redis_servers import free_port
from tests.support.servers import ROOT


@pytest.fixture
def closed(monkeypatch) -> list[str]:
    """The real backend and store, their closing recorded in order."""
    events: list[str] = []

    def recording(create, what):
        def make(config, **options):
            thing = create(config, **options)
            close = thing.close

            async def recorded_close():
                events.append(what)
                await close()

            thing.close = recorded_close
            return thing

        return make

    monkeypatch.setattr(context, "create_backend", recording(context.create_backend, "backend"))
    monkeypatch.setattr(context, "create_session_store", recording(context.create_session_store, "store"))
    return events


@pytest.fixture
def cli_config(tmp_path):
    users = tmp_path / "users.json"
    users.write_text(json.dumps({"users": [{"name": "ann", "password": "00", "ident": "a"}]}))
    os.chmod(users, 0o644)
    document = {"backend": {"file": {"path": "users.json", "check_passwords": False}},
                "sessions": {"sqlite": {"path": str(tmp_path / "sessions.db")}}}
    return build_config(document, path=str(tmp_path / "hs.toml"), environ={})


async def test_stores_are_opened_and_closed_in_reverse_order_on_an_error(cli_config, tmp_path, closed):
    (tmp_path / "sessions.db").touch()  # a server has run here
    with pytest.raises(RuntimeError, match="the command failed"):
        async with cli_stores.stores(cli_config) as (backend, store):
            assert await backend.get_user("ann") is not None
            assert await store.devices("ann") == []
            raise RuntimeError("the command failed")
    assert closed == ["store", "backend"]


async def test_stores_refuse_a_missing_session_file_before_opening_anything(cli_config, tmp_path, closed):
    with pytest.raises(ConfigError, match=r"^sessions\.sqlite\.path: .*sessions\.db does not exist"):
        async with cli_stores.stores(cli_config):
            pytest.fail("opened")
    assert closed == [] and not (tmp_path / "sessions.db").exists()


async def test_the_user_backend_alone_is_closed_and_quiet_about_modes(cli_config, caplog, closed):
    with pytest.raises(KeyError):
        async with cli_stores.user_backend(cli_config) as backend:
            assert isinstance(backend, FileBackend) and not backend.warn_exposed
            assert await backend.get_user("ann") is not None
            raise KeyError("x")
    assert closed == ["backend"]
    assert not [r for r in caplog.records if "can be accessed" in r.getMessage()]


async def test_a_backend_not_started_is_closed_too(cli_config, closed):
    async with cli_stores.user_backend(cli_config, start=False) as backend:
        assert await backend.get_user("ann") is None  # not loaded: adding and locking write without reading all
    assert closed == ["backend"]


def test_a_session_store_that_cannot_be_reached_is_named_as_such(tmp_path):
    # Not "user store unavailable": the operator would look at the users file, not at Redis.
    port = free_port()  # nothing listens there
    (tmp_path / "users.json").write_text(json.dumps({"users": []}))
    config = tmp_path / "hs.toml"
    config.write_text(f'[auth]\njwt_secret = "{JWT_SECRET}"\n[backend.file]\npath = "users.json"\n'
                      f'[sessions]\nstore = "redis"\n[sessions.redis]\nurl = "redis://127.0.0.1:{port}/0"\n')
    done = subprocess.run([sys.executable, "run.py", "--config", str(config), "sessions", "list", "ann"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].startswith(
        f"homeserver: error: session store unavailable: Redis (127.0.0.1:{port}): "), done.stderr
