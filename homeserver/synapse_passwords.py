"""Synapse's password hashes, checked exactly as Synapse checks them (for users moved here).

Synapse (synapse/handlers/auth.py, `hash` and `validate_hash`, unchanged since 2021)
hashes `unicodedata.normalize("NFKC", password)` followed by `password_config.pepper`,
both UTF-8 (strict: a lone surrogate raises), cut to bcrypt's 72 bytes, with
`bcrypt_rounds`. Its hash is kept as bcrypt's own text (`$2b$12$...`). So:

- a password and its NFKC form are the same password (a ligature `ﬁ` and `fi`, a
  full-width `Ａ` and `A`, `e` + combining acute and `é`);
- the pepper counts only within the first 72 bytes: past 71 bytes of password it is cut
  off, partly or wholly, and any password sharing those first bytes matches;
- a password holding a lone surrogate (JSON allows "\\ud800") matches no Synapse hash:
  Synapse could not have made one for it.

Nothing else changes for this server's own records (homeserver/passwords.py): there the
password is not normalised and no pepper is added. Blocking, like `passwords.check`: run
it on the password pool.
"""

from __future__ import annotations

import unicodedata

import bcrypt

from homeserver.passwords import MAX_PASSWORD_BYTES, HashDecodeError


def synapse_password_bytes(password: str, pepper: str = "") -> bytes | None:
    """The bytes Synapse hands bcrypt for `password`; None where Synapse's own encoding fails
    (a lone surrogate), so that no Synapse hash can be of that password."""
    try:
        raw = unicodedata.normalize("NFKC", password).encode("utf-8") + pepper.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return raw[:MAX_PASSWORD_BYTES]


def check_synapse_password(password: str, hashed: str | bytes, pepper: str = "") -> bool:
    """Whether `password` matches a hash Synapse made with `pepper`: Synapse's validate_hash.

    An empty hash matches nothing (Synapse's rule); a hash bcrypt cannot read raises
    HashDecodeError, as a bad stored hash of our own does.
    """
    if not hashed:
        return False
    if isinstance(hashed, str):
        try:
            hashed = hashed.encode("ascii")
        except UnicodeEncodeError:
            raise HashDecodeError("stored Synapse password hash is not ASCII, so not a bcrypt hash") from None
    raw = synapse_password_bytes(password, pepper)
    if raw is None:
        return False
    try:
        return bcrypt.checkpw(raw, hashed)
    except ValueError:
        raise HashDecodeError("stored Synapse password hash is not a bcrypt hash") from None
