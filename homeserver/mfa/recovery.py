"""Recovery codes: ten one-time codes a person writes down when they add their first second
factor, for the day the phone is lost. Kept only as keyed digests; each works once.

A code is 12 characters of Crockford's base32 alphabet (digits and lower-case letters but
i, l, o and u), shown in three groups: `7kq2-m9xd-a4fw`. 60 random bits a code.

Why a keyed digest (HMAC-SHA256 under a key derived from the operator's `[mfa]` key) and
not bcrypt: bcrypt's cost exists to slow the guessing of secrets people choose, which an
attacker can enumerate. These are 60 random bits: an offline search of one code's digest
needs ~2^59 tries even with the key, and without the key (a stolen database alone) the
digests say nothing at all. bcrypt would add ~0.25 s of CPU per code to every sign-in that
uses one, and, being salted, could not be looked up: a person's ten digests would each be
tried (the issue asks for no second bcrypt on a sign-in). A digest is found by equality in
the store, in one step that also takes it out (used once).
"""

from __future__ import annotations

import secrets

from homeserver.mfa.sealing import Keyring

COUNT = 10
GROUPS = 3
GROUP_LENGTH = 4
CODE_LENGTH = GROUPS * GROUP_LENGTH
# Crockford's base32: no i, l, o or u, so nothing reads as another character; 32 symbols
# make 5 bits each (secrets.choice draws each uniformly).
ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
# What people type for the letters left out (Crockford's decoding rules).
_LOOKALIKES = str.maketrans({"i": "1", "l": "1", "o": "0"})
# Separators people type, or their phone's keyboard puts, between the groups.
_SEPARATORS = str.maketrans("", "", " \t\r\n-_.\u2010\u2011\u2012\u2013\u2014\u2212\u00a0")
_MAX_INPUT = 128


def new_code() -> str:
    """One fresh code, grouped for reading: `xxxx-xxxx-xxxx`."""
    raw = "".join(secrets.choice(ALPHABET) for _ in range(CODE_LENGTH))
    return "-".join(raw[i:i + GROUP_LENGTH] for i in range(0, CODE_LENGTH, GROUP_LENGTH))


def new_codes(count: int = COUNT) -> list[str]:
    """`count` distinct fresh codes."""
    codes: list[str] = []
    while len(codes) < count:
        code = new_code()
        if code not in codes:
            codes.append(code)
    return codes


def normalize(text: str) -> str | None:
    """A typed code as it is kept: lower case, separators and spaces dropped, look-alike
    letters read as Crockford says (O as 0, I and L as 1); None when it cannot be a code."""
    if len(text) > _MAX_INPUT:
        return None
    code = text.translate(_SEPARATORS).lower().translate(_LOOKALIKES)
    if len(code) != CODE_LENGTH or any(c not in ALPHABET for c in code):
        return None
    return code


def _message(user: str, code: str) -> bytes:
    # The person is part of what is digested: a code is theirs only.
    return f"{user}\0{code}".encode("utf-8", "surrogatepass")


def digest(keys: Keyring, user: str, code: str) -> str:
    """The digest a new code is kept as (`code` as shown or typed)."""
    normal = normalize(code)
    if normal is None:
        raise ValueError("not a recovery code")
    return keys.digest(_message(user, normal))


def candidate_digests(keys: Keyring, user: str, text: str) -> list[str]:
    """The digests a typed code may be kept as (one a key: the current one first); [] when
    the text cannot be a recovery code."""
    normal = normalize(text)
    if normal is None:
        return []
    return keys.digests(_message(user, normal))
