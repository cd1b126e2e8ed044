"""User names and user IDs: `@name:server`, and the guard for names no account can have."""

from __future__ import annotations

import re

# A Matrix user ID is at most 255 bytes (v1.12, "User Identifiers"), so a longer name or
# ID can match nobody.
MAX_USER_ID_BYTES = 255
# C0 and C1 control characters (NUL included) are never part of a name; some LDAP
# libraries mis-escape NUL, and they make odd store keys.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def possible_name(name: str) -> bool:
    """Say whether any account could have this name: the one guard before every store.

    Empty text, control characters, lone surrogates (JSON allows "\\ud800") and names
    over 255 bytes are refused here, so no backend sees them.
    """
    if name.isascii():
        # The common case, without encoding or a regex: for ASCII, isprintable() is False
        # exactly for the control characters (\x00-\x1f, \x7f), and a byte is a character.
        return 0 < len(name) <= MAX_USER_ID_BYTES and name.isprintable()
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:  # lone surrogates
        return False
    return 0 < size <= MAX_USER_ID_BYTES and not _CONTROL.search(name)


def user_id(name: str, server_name: str) -> str:
    """The Matrix user ID of a stored name on this server."""
    return f"@{name}:{server_name}"


def local_name(text: str, server_name: str) -> str:
    """Reduce a full user ID of this server to its name; any other text is a name already."""
    if text.startswith("@") and ":" in text:
        localpart, _, domain = text[1:].partition(":")
        if domain == server_name:
            return localpart
    return text
