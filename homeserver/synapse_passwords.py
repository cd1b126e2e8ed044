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

A record moved from Synapse says so (`password_scheme: "synapse"`, backends.base.User), and
the one password check every form uses (homeserver.passwords.check_password) checks it
here, with the pepper of `[auth] synapse_pepper` or `synapse_pepper_file` (`load_pepper`).
Nothing else changes for this server's own records: there the password is not normalised
and no pepper is added. Blocking, like `passwords.check`: run it on the password pool.
"""

from __future__ import annotations

import unicodedata
from typing import TYPE_CHECKING

import bcrypt

from backends.base import ConfigError
from backends.hashes import MAX_PASSWORD_BYTES, HashDecodeError
from backends.secret_file import read_secret_file

if TYPE_CHECKING:
    from homeserver.config import Config


def load_pepper(config: Config) -> str:
    """Synapse's pepper as `[auth] synapse_pepper` or `synapse_pepper_file` gives it ("" for
    none). The file's text is taken as it is but for the line ending an editor adds: a
    pepper is any text, and Synapse appends it whole."""
    pepper, path = config.get("auth", "synapse_pepper"), config.get("auth", "synapse_pepper_file")
    if pepper and path:
        raise ConfigError("auth.synapse_pepper and auth.synapse_pepper_file: give one of them, not both")
    if path:
        return read_secret_file("auth.synapse_pepper_file", config.resolve_path(path), strip=False)
    return str(pepper)


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
