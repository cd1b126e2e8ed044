"""bcrypt password hashing and checking, with the stored hex form and the 72-byte rule."""

from __future__ import annotations

import asyncio
import binascii
import concurrent.futures
import logging
import os

import bcrypt

logger = logging.getLogger(__name__)

# bcrypt only looks at the first 72 bytes of a password; bcrypt 5 raises on longer
# input instead of cutting it, so cut it ourselves. Hashes made by older bcrypt (which
# cut silently), htpasswd or Synapse then still verify.
MAX_PASSWORD_BYTES = 72


class HashDecodeError(Exception):
    """The stored password text is not hex, or decodes to something that is not bcrypt."""


def password_bytes(password: str) -> bytes:
    """Return the bytes bcrypt sees: UTF-8 (lone surrogates kept), cut to 72 bytes."""
    return password.encode("utf-8", "surrogatepass")[:MAX_PASSWORD_BYTES]


def decode_stored(stored: str) -> bytes:
    """Decode the stored hex text into the bcrypt hash bytes (rule 4)."""
    try:
        return binascii.a2b_hex(stored)
    except (binascii.Error, ValueError):
        raise HashDecodeError("stored password is not hex text") from None


def check(password: str, hashed: bytes) -> bool:
    """Check a password against decoded bcrypt bytes (rule 5); blocking, run in an executor."""
    try:
        return bcrypt.checkpw(password_bytes(password), hashed)
    except ValueError:
        raise HashDecodeError("stored password decodes to something that is not a bcrypt hash") from None


def hash_password(password: str, rounds: int = 12) -> str:
    """Return the hex text of a new bcrypt hash, the form the user stores keep."""
    return bcrypt.hashpw(password_bytes(password), bcrypt.gensalt(rounds)).hex()


class PasswordChecker:
    """Runs bcrypt off the event loop on a pool sized to the CPU, so logins never stall it."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or os.cpu_count() or 1
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.workers, thread_name_prefix="bcrypt"
        )

    async def check(self, password: str, hashed: bytes) -> bool:
        return await asyncio.get_running_loop().run_in_executor(self._pool, check, password, hashed)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
