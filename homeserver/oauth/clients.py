"""What the authorization endpoint and the device grant know of a registered client: whether a
redirect URI is one of its own (exactly, or for an http loopback URI on any port: RFC 8252
7.3), and the name people are shown for it."""

from __future__ import annotations

from typing import Any
from urllib.parse import SplitResult, urlsplit

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")


def loopback_host(netloc: str) -> str | None:
    """The loopback host of an authority (port dropped), or None for any other host."""
    netloc = netloc.lower()
    host = netloc if netloc in LOOPBACK_HOSTS else netloc.rsplit(":", 1)[0]
    return host if host in LOOPBACK_HOSTS else None


def host_of(parts: SplitResult) -> str:
    """A URI's host, lower case (no brackets around an IPv6 address)."""
    return (parts.hostname or "").lower()


def redirect_matches(registered: list[str], given: str) -> bool:
    """Whether `given` is one of the client's redirect URIs: exactly, or for an http loopback URI
    with any port (RFC 8252 7.3)."""
    if given in registered:
        return True
    try:
        parts = urlsplit(given)
        port = parts.port
    except ValueError:
        return False
    if parts.scheme != "http" or port is None or parts.hostname is None:
        return False
    host = loopback_host(parts.netloc)
    if host is None:
        return False
    without_port = parts._replace(netloc=host).geturl()
    for uri in registered:
        mine = urlsplit(uri)
        if mine.scheme == "http" and loopback_host(mine.netloc) == host:
            if mine._replace(netloc=host).geturl() == without_port:
                return True
    return False


def display_name(metadata: dict[str, Any]) -> str:
    """What people are shown as the client's name: its client_name, else its client_uri's host."""
    host = host_of(urlsplit(str(metadata.get("client_uri", ""))))
    return str(metadata.get("client_name") or host or "An application")
