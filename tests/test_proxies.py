"""Client addresses from X-Forwarded-For, believed only from trusted proxies."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from tornado.httputil import HTTPHeaders

from homeserver.inflight import InFlight
from homeserver.proxies import ClientAddress


def request(peer: str, forwarded: str | None = None) -> Any:
    headers = HTTPHeaders()
    if forwarded is not None:
        headers["X-Forwarded-For"] = forwarded
    return SimpleNamespace(remote_ip=peer, headers=headers)


@pytest.mark.parametrize(
    "trusted, peer, forwarded, client",
    [
        ([], "10.0.0.5", "203.0.113.9", "10.0.0.5"),  # nobody trusted: the header is ignored
        (["10.0.0.0/8"], "192.0.2.1", "203.0.113.9", "192.0.2.1"),  # untrusted peer
        (["10.0.0.0/8"], "10.0.0.5", None, "10.0.0.5"),
        (["10.0.0.0/8"], "10.0.0.5", "203.0.113.9", "203.0.113.9"),
        (["10.0.0.0/8"], "10.0.0.5", "1.1.1.1, 203.0.113.9, 10.0.0.7", "203.0.113.9"),  # skip trusted hops
        (["10.0.0.0/8"], "10.0.0.5", "10.0.0.8, 10.0.0.7", "10.0.0.8"),  # all trusted: the leftmost
        (["10.0.0.0/8"], "10.0.0.5", "203.0.113.9, junk", "10.0.0.5"),  # garbage: stop there
        (["10.0.0.0/8"], "10.0.0.5", "", "10.0.0.5"),
        (["::1"], "::1", "2001:db8::7", "2001:db8::7"),
        (["127.0.0.1"], "127.0.0.1", " 198.51.100.4 ", "198.51.100.4"),
    ],
)
def test_client_address(trusted, peer, forwarded, client):
    assert ClientAddress(trusted)(request(peer, forwarded)) == client


def test_bad_cidr_is_a_config_error():
    from homeserver.config import build_config
    from homeserver.errors import ConfigError

    with pytest.raises(ConfigError, match="trusted_proxies"):
        build_config({"server": {"trusted_proxies": ["10.0.0.0/33"]}})


async def test_inflight_wait_idle():
    inflight = InFlight()
    assert await inflight.wait_idle(0) is True
    handler = object()
    inflight.add(handler)
    assert await inflight.wait_idle(0.05, poll=0.01) is False
    abort = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, abort.set)
    assert await inflight.wait_idle(60, abort, poll=0.01) is False
    asyncio.get_running_loop().call_later(0.05, inflight.discard, handler)
    assert await inflight.wait_idle(60, poll=0.01) is True
