"""Second-factor secrets at rest: sealed with AES-256-GCM under a key the operator keeps
(`[mfa] key`, or the key file made on first start), bound to their owner by associated data,
and still opened after a rotation by the keys listed in `[mfa] previous_keys`.

The operator's key is text (at least 32 bytes, as `[auth] jwt_secret`); the AES key and the
recovery codes' digest key are derived from it with HKDF-SHA256, each for its own purpose,
so one text serves both and neither reveals the other.

A sealed value: version byte 1, a 4-byte key id (which key sealed it, so opening tries one
key, not all), a 12-byte random nonce, then the ciphertext and its 16-byte tag.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from backends.secret_file import SecretFileMissing, read_secret_file
from homeserver.config import Config
from homeserver.errors import ConfigError

logger = logging.getLogger(__name__)

VERSION = b"\x01"
NONCE_BYTES = 12
KEY_ID_BYTES = 4
MIN_KEY_BYTES = 32
_HEADER = len(VERSION) + KEY_ID_BYTES + NONCE_BYTES


class SealError(Exception):
    """A sealed value that no key opens (another key, tampered, or bound to another owner).
    Its message never holds the value."""


def _derive(text: str, purpose: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"homeserver mfa " + purpose).derive(
        text.encode("utf-8")
    )


@dataclass(frozen=True, slots=True)
class _Key:
    key_id: bytes
    aead: AESGCM
    digest_key: bytes


def _key(text: str) -> _Key:
    if len(text.encode("utf-8")) < MIN_KEY_BYTES:
        raise ValueError(f"an mfa key must be at least {MIN_KEY_BYTES} bytes")
    return _Key(
        key_id=_derive(text, b"key id")[:KEY_ID_BYTES],
        aead=AESGCM(_derive(text, b"aes-256-gcm v1")),
        digest_key=_derive(text, b"recovery codes v1"),
    )


class Keyring:
    """The current key (seals) and the previous ones (open only)."""

    def __init__(self, current: str, previous: Sequence[str] = ()) -> None:
        self._current = _key(current)
        self._keys = {self._current.key_id: self._current}
        for text in previous:
            if text != current:
                key = _key(text)
                self._keys.setdefault(key.key_id, key)

    def seal(self, plaintext: bytes, associated: bytes) -> bytes:
        """`plaintext` encrypted and authenticated with the current key, bound to `associated`
        (the same bytes must be given to open it)."""
        nonce = secrets.token_bytes(NONCE_BYTES)
        key = self._current
        return VERSION + key.key_id + nonce + key.aead.encrypt(nonce, plaintext, associated)

    def open(self, sealed: bytes, associated: bytes) -> bytes:
        """The plaintext of a value sealed with any of the keys for `associated`; SealError
        otherwise."""
        key = self._keys.get(sealed[1:1 + KEY_ID_BYTES]) if sealed[:1] == VERSION else None
        if key is None or len(sealed) < _HEADER + 16:
            raise SealError("sealed with an unknown key, or not a sealed value")
        try:
            return key.aead.decrypt(sealed[1 + KEY_ID_BYTES:_HEADER], sealed[_HEADER:], associated)
        except InvalidTag:
            raise SealError("the sealed value does not open: tampered, or bound to another owner") from None

    def is_current(self, sealed: bytes) -> bool:
        """Whether the current key sealed it (else it is due to be sealed again)."""
        return sealed[1:1 + KEY_ID_BYTES] == self._current.key_id

    def digest(self, message: bytes) -> str:
        """A keyed digest (HMAC-SHA256, hex) with the current key: recovery codes are kept so."""
        return hmac.new(self._current.digest_key, message, hashlib.sha256).hexdigest()

    def digests(self, message: bytes) -> list[str]:
        """The digests of `message` under every key, the current first (a code kept before a
        rotation is still found)."""
        keys = [self._current, *(k for k in self._keys.values() if k is not self._current)]
        return [hmac.new(k.digest_key, message, hashlib.sha256).hexdigest() for k in keys]


def associated_data(kind: str, user: str, factor_id: str) -> bytes:
    """What a factor's sealed secret is bound to: a value copied to another factor, another
    person or another kind does not open."""
    return "\0".join(("homeserver-mfa", kind, user, factor_id)).encode("utf-8", "surrogatepass")


def key_file_path(config: Config) -> str:
    """`[mfa] key_file`, already taken from the state directory when relative (it is one of
    homeserver.config.WRITTEN_FILES)."""
    path: str = config.get("mfa", "key_file")
    return path


def load_key(config: Config) -> str:
    """The configured `[mfa] key`, or the kept one, made and kept on first start.

    The file is written whole under another name and linked into place, so a process
    starting at the same moment reads either no file (and makes its own, losing the race
    to link it: it then reads the winner's) or the whole key, never a half-written one.
    """
    configured: str = config.get("mfa", "key")
    if configured:
        return configured
    path = key_file_path(config)
    try:
        return read_secret_file("mfa.key_file", path, min_bytes=MIN_KEY_BYTES)
    except SecretFileMissing:
        pass
    key = secrets.token_urlsafe(48)
    folder = os.path.dirname(path) or "."
    try:
        fd, temporary = tempfile.mkstemp(prefix=".mfa-key-", dir=folder)  # mode 0600
    except OSError as exc:
        raise ConfigError(f"mfa.key_file: cannot create {path} ({exc.strerror})") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(key + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.link(temporary, path)
    except FileExistsError:
        return read_secret_file("mfa.key_file", path, min_bytes=MIN_KEY_BYTES)
    except OSError as exc:
        raise ConfigError(f"mfa.key_file: cannot create {path} ({exc.strerror})") from None
    finally:
        os.unlink(temporary)
    logger.info("generated a new second-factor key in %s (back it up, apart from the session store)", path)
    return key


def keyring(config: Config) -> Keyring:
    """The keyring of `[mfa]`: its key (or key file) and `previous_keys`."""
    return Keyring(load_key(config), config.get("mfa", "previous_keys"))
