"""The account page tests' fixtures: a Browser on the page, and the in-process fake Synapse its
cross-signing reset approval calls."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.fake_synapse import Calls, serve_fake
from tests.support.page_client import Browser


@pytest.fixture
def browser(fetch) -> Browser:
    return Browser(fetch)


@pytest.fixture
def fake_synapse(hs, io_loop) -> Iterator[Calls]:
    """An in-process fake Synapse (tests/support/fake_synapse.py), and hs.delegation calling it."""
    calls = Calls()
    server = serve_fake(hs, calls)
    yield calls
    io_loop.run_sync(hs.delegation.close)
    server.stop()
