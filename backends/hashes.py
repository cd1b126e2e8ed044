"""The stored password's one form, the same in every store: the hex text of a bcrypt hash."""

from __future__ import annotations

import binascii
import re

# bcrypt only looks at the first 72 bytes of a password; bcrypt 5 raises on longer input
# instead of cutting it, so the checks cut it themselves (homeserver.passwords,
# homeserver.synapse_passwords). Hashes made by older bcrypt (which cut silently),
# htpasswd or Synapse then still verify.
MAX_PASSWORD_BYTES = 72


class HashDecodeError(Exception):
    """The stored password text is not hex, or decodes to something that is not bcrypt."""


# What bcrypt.checkpw can ever match: a known variant, a cost of 04 to 31, and 53 characters
# of salt and digest. bcrypt itself takes some malformed hashes (a truncated digest, say)
# and then answers "no" to every password; such a hash is unusable all the same.
BCRYPT_HASH = re.compile(r"\$2[abxy]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")


PLAIN_BCRYPT = "it is a bcrypt hash as plain text, not its hex text (store what `run.py hash-password` prints)"
HEX_NOT_BCRYPT = "it is hex text, but not of a bcrypt hash"


def operator_mistake(text: str) -> str | None:
    """The two stored forms that are plainly an operator's slip, refused at start-up.

    A bcrypt hash pasted as plain text, and hex of something that is no bcrypt hash. Other
    text that is not hex at all still loads: the specification's rule 4 answers its logins
    (500 "Password hash decoding failed"), and that rule must stay reachable.
    """
    problem = stored_password_problem(text)
    return problem if problem in (PLAIN_BCRYPT, HEX_NOT_BCRYPT) else None


def stored_password_problem(text: str) -> str | None:
    """Say why `text` cannot be a stored password (hex text of a bcrypt hash); None if it can."""
    if not text:
        return "it is empty"
    if BCRYPT_HASH.fullmatch(text):
        return PLAIN_BCRYPT
    try:
        raw = binascii.a2b_hex(text)  # unlike bytes.fromhex, no spaces between the pairs
    except (binascii.Error, ValueError):
        return "it is not hex text"
    try:
        decoded = raw.decode("ascii")
    except UnicodeDecodeError:
        decoded = ""
    if not BCRYPT_HASH.fullmatch(decoded):
        return HEX_NOT_BCRYPT
    return None
