"""Fixtures of the OAuth client tests: a `run.py` with `[oauth]` on, and a headless Chromium."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.browser import chrome
from tests.support.servers import ServerProcess

# Short (the least the server takes), so that a test sees a client refresh by itself
# after waiting this long.
LIFETIME = 10
OAUTH = f"[oauth]\nenabled = true\naccess_token_lifetime = {LIFETIME}\n"
PASSWORDS = {"alice": "wonderland", "bob": "builder"}


@pytest.fixture(scope="module")
def oauth_server(tmp_path_factory) -> Iterator[ServerProcess]:
    """`run.py` on the test users (alice, bob), OAuth on, access tokens living LIFETIME s."""
    server = ServerProcess(tmp_path_factory.mktemp("oauth"), 1, OAUTH)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    with chrome() as browser:
        yield browser
