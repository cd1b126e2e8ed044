"""The client address of a request: X-Forwarded-For only from trusted proxies."""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable

from tornado.httputil import HTTPServerRequest


class ClientAddress:
    """Resolve a request's client address, believing X-Forwarded-For only from `trusted` peers.

    Any client can send X-Forwarded-For, so the header counts only when the TCP peer is a
    configured proxy. The hops are read right to left, skipping trusted proxies: the first
    untrusted hop is the client (the leftmost hops could have been made up by the client).
    """

    def __init__(self, trusted: Iterable[str] = ()) -> None:
        self.networks = tuple(ipaddress.ip_network(item, strict=False) for item in trusted)
        # Peers repeat (the proxy, a few clients): remember the verdicts.
        self.is_trusted = functools.lru_cache(maxsize=1024)(self._is_trusted)

    def _is_trusted(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in self.networks)

    def __call__(self, request: HTTPServerRequest) -> str:
        peer = request.remote_ip or ""
        if not self.networks or not self.is_trusted(peer):
            return peer
        header = request.headers.get("X-Forwarded-For")
        if not header:
            return peer
        client = peer
        for hop in reversed(header.split(",")):
            hop = hop.strip()
            try:
                ipaddress.ip_address(hop)
            except ValueError:
                break  # garbage: trust nothing further left
            client = hop
            if not self.is_trusted(hop):
                break
        return client
