"""What the authorization endpoint and the device grant know of a registered client: whether a
redirect URI is one of its own (exactly, or for an http loopback URI on any port: RFC 8252
7.3), and the name people are shown for it, with no character that reorders or hides text."""

from __future__ import annotations

import re
import unicodedata
from typing import Any
from urllib.parse import SplitResult, urlsplit

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
# What no name people are shown may hold: controls (a line break forges log lines), format
# characters (U+202E and the other bidirectional controls reorder the rest of the line, the
# address shown after the name among it; U+00AD, U+2060, U+FEFF and the tags hide), line and
# paragraph separators, private-use, unassigned and surrogate code points. The zero-width
# non-joiner and joiner stay: Persian, the Indic scripts and emoji need them.
HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
JOINERS = frozenset("\u200c\u200d")
# An http loopback redirect URI as a browser is sent to it: the scheme and host in lower case,
# a port of 1-65535 without a leading zero (or none), then a path and query with no fragment.
LOOPBACK_URI = re.compile(r"http://(localhost|127\.0\.0\.1|\[::1\])(?::([1-9][0-9]{0,4}))?(/[^#]*)?")


def loopback_host(netloc: str) -> str | None:
    """The loopback host of an authority (port dropped), or None for any other host."""
    netloc = netloc.lower()
    host = netloc if netloc in LOOPBACK_HOSTS else netloc.rsplit(":", 1)[0]
    return host if host in LOOPBACK_HOSTS else None


def host_of(parts: SplitResult) -> str:
    """A URI's host, lower case (no brackets around an IPv6 address)."""
    return (parts.hostname or "").lower()


def form_action_source(uri: str) -> str:
    """The CSP source a form needs to be redirected to `uri`: its origin, or its scheme alone
    for a private-use scheme and for an IPv6 literal, which CSP host sources cannot name (a
    browser drops such a source, and the redirect is blocked)."""
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme in ("http", "https") and ":" not in (parts.hostname or ""):
        return f"{scheme}://{parts.netloc.lower()}"
    return f"{scheme}:"


def _loopback(uri: str) -> tuple[str, str] | None:
    """An http loopback URI's host and what follows its port (path and query), or None for any
    other URI (or one with a fragment mark, an upper-case scheme or host, a port out of 1-65535
    or written with a leading zero)."""
    found = LOOPBACK_URI.fullmatch(uri)
    if found is None or (found[2] is not None and int(found[2]) > 65535):
        return None
    return found[1], found[3] or ""


def redirect_matches(registered: list[str], given: str) -> bool:
    """Whether `given` is one of the client's redirect URIs: exactly, or for an http loopback URI
    exactly but for its port, which may be any (RFC 8252 7.3; RFC 9700 4.1.3: exact string
    matching). No trailing `?` or `#`, no other spelling of the scheme or the host, no port 0."""
    if given in registered:
        return True
    mine = _loopback(given)
    return mine is not None and any(_loopback(uri) == mine for uri in registered)


def hidden(char: str) -> bool:
    """Whether a character reorders or hides text (HIDDEN_CATEGORIES)."""
    return unicodedata.category(char) in HIDDEN_CATEGORIES and char not in JOINERS


def without_hidden(text: str) -> str:
    return "".join(char for char in text if not hidden(char))


def display_name(metadata: dict[str, Any]) -> str:
    """What people are shown as the client's name: its client_name, else its client_uri's host
    (no hidden characters: registration refuses them, and a name kept from before loses them)."""
    host = host_of(urlsplit(str(metadata.get("client_uri", ""))))
    return without_hidden(str(metadata.get("client_name") or "")) or host or "An application"
