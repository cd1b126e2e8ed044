"""base64url without padding (RFC 4648 section 5; RFC 7515 appendix C): what JWTs, PKCE
challenges (RFC 7636) and the signed UIA sessions are written in."""

from __future__ import annotations

import base64


def encode(data: bytes) -> str:
    """`data` as base64url text without its trailing `=`."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def decode(text: str) -> bytes:
    """The bytes of base64url text written with or without padding; ValueError (binascii.Error)
    for text that is not base64url."""
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
