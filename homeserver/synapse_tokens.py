"""Synapse's own access tokens, taken here after a move (homeserver.migration, issue 35).

Synapse (1.34 and newer, `AuthHandler.generate_access_token`) makes opaque tokens
`syt_<unpadded standard base64 of the localpart>_<20 random letters>_<base62 CRC-32 of what
precedes it, at least 6 characters>`. The move keeps each live one as a session under the
SHA-256 of the token, as ours are kept, so the auth step needs only the user: it checks the
CRC (a token with a typo costs no store trip), reads the localpart, then asks the sessions
as for one of ours. The user store and the session decide; the name in the token is only
where to look (a token naming another user finds no session).

Older Synapses made macaroons (base64 text, no dots); a token that is neither ours (a JWT:
three parts joined by dots) nor a well-formed `syt_`, and is base64 text as a macaroon is,
is looked up by its digest alone in the move's bookkeeping (`ImportedState.token_user`),
one store trip more, only for such tokens (the check counts the live ones a move carries:
`names_its_user`). Any other text is no token: the sessions no token has (a kept device's,
a grant's) are keyed by digests of text with a colon.
"""

from __future__ import annotations

import base64
import binascii
import re
import zlib

ACCESS_PREFIX = "syt_"
_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
CRC_WIDTH = 6
# Longer than any token Synapse makes for a 255-byte localpart: refused before any work.
MAX_SYNAPSE_TOKEN = 512


def base62(number: int, width: int = CRC_WIDTH) -> str:
    """Synapse's `base62_encode`: most significant digit first, zero-padded to `width`."""
    digits = ""
    while number:
        number, rest = divmod(number, 62)
        digits = _BASE62[rest] + digits
    return digits.rjust(width, "0")


def synapse_token_user(token: str) -> str | None:
    """The localpart a `syt_` token names, when its CRC holds; None for any other text."""
    if len(token) > MAX_SYNAPSE_TOKEN or not token.startswith(ACCESS_PREFIX) or not token.isascii():
        return None
    base, _, crc = token.rpartition("_")
    parts = base.split("_")
    if len(parts) != 3 or not parts[1] or not parts[2].isalpha():
        return None
    if base62(zlib.crc32(base.encode("ascii"))) != crc:
        return None
    encoded = parts[1]
    try:
        localpart = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return localpart or None


# An older Synapse's macaroon: pymacaroons' serialization, base64 (URL-safe, padded or not).
# Only such text is looked up by digest: the keys of the sessions no token has (a kept
# device's, homeserver.migration.plan.device_digest; a grant's) are digests of text with a
# colon, which anyone could otherwise send as a token to open them.
_MACAROON = re.compile(r"[A-Za-z0-9_\-+/]+={0,2}")


def maybe_legacy(token: str) -> bool:
    """Whether a token that is not ours may be one Synapse made that does not name its user
    (looked up by digest): base64 text, as a macaroon is (so never three parts joined by dots,
    as ours), not too long."""
    return len(token) <= 4096 and _MACAROON.fullmatch(token) is not None


def names_its_user(token: str, localpart: str) -> bool:
    """Whether a token Synapse made names its user (found without a lookup by digest)."""
    return synapse_token_user(token) == localpart
