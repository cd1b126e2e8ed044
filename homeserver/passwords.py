"""bcrypt password hashing and checking, with the stored hex form and the 72-byte rule; and
the check of a user's password (rules 4-5) every password form uses: login, UIA, the account page."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
from typing import TYPE_CHECKING

import bcrypt

from backends.base import SYNAPSE_SCHEME, User
from backends.hashes import MAX_PASSWORD_BYTES, HashDecodeError, stored_password_problem
from homeserver.errors import M_LIMIT_EXCEEDED, M_UNKNOWN, MatrixError
from homeserver.synapse_passwords import check_synapse_password

if TYPE_CHECKING:
    from homeserver.users import Users

logger = logging.getLogger(__name__)

__all__ = [
    "MAX_PASSWORD_BYTES",
    "HashDecodeError",
    "Overloaded",
    "PasswordChecker",
    "check",
    "check_password",
    "hash_password",
    "overloaded",
    "password_bytes",
    "waste_password_check",
]


def password_bytes(password: str) -> bytes:
    """Return the bytes bcrypt sees: UTF-8 (lone surrogates kept), cut to 72 bytes."""
    return password.encode("utf-8", "surrogatepass")[:MAX_PASSWORD_BYTES]


def check(password: str, hashed: bytes) -> bool:
    """Check a password against decoded bcrypt bytes (rule 5); blocking, run in an executor."""
    try:
        return bcrypt.checkpw(password_bytes(password), hashed)
    except ValueError:
        raise HashDecodeError("stored password decodes to something that is not a bcrypt hash") from None


def hash_password(password: str, rounds: int = 12) -> str:
    """Return the hex text of a new bcrypt hash, the form the user stores keep."""
    return bcrypt.hashpw(password_bytes(password), bcrypt.gensalt(rounds)).hex()


class Overloaded(Exception):
    """Too many password checks are already waiting; the login is refused at once."""


def _lower_priority() -> None:
    """Run bcrypt threads at a lower CPU priority than the event loop thread.

    On Linux setpriority() on a thread id affects that thread only, so cheap requests on
    the event loop keep their latency while the pool saturates every core with bcrypt.
    """
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BCRYPT_NICENESS)
    except (AttributeError, OSError):  # not Linux, or not permitted: run at normal priority
        pass


BCRYPT_NICENESS = 10


class PasswordChecker:
    """Runs bcrypt off the event loop on a pool sized to the CPU, so logins never stall it.

    At most `max_pending` checks run or wait at once; past that `check` raises Overloaded
    instead of queueing, so a login flood cannot grow memory or latency without bound.
    """

    def __init__(self, workers: int = 0, max_pending: int = 64, rounds: int = 12, synapse_pepper: str = "") -> None:
        self.workers = workers or os.cpu_count() or 1
        self.max_pending = max_pending
        self.pending = 0
        self.rounds = rounds  # the cost of the stand-in hash `waste` checks against
        # Synapse's `password_config.pepper`, for the records moved from it (`[auth] synapse_pepper`).
        self.synapse_pepper = synapse_pepper
        self._stand_in: bytes | None = None
        self.wasted = 0  # checks made against the stand-in (tests count them)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.workers, thread_name_prefix="bcrypt", initializer=_lower_priority
        )

    async def check(self, password: str, hashed: bytes, *, scheme: str | None = None) -> bool:
        """The password against a bcrypt hash, on the pool: this server's way, or Synapse's
        (`scheme` "synapse": NFKC and its pepper) for a record moved from it."""
        if self.pending >= self.max_pending:
            raise Overloaded()
        self.pending += 1
        logger.debug("password check queued (%d pending)", self.pending)
        loop = asyncio.get_running_loop()
        try:
            if scheme == SYNAPSE_SCHEME:
                return await loop.run_in_executor(
                    self._pool, check_synapse_password, password, hashed, self.synapse_pepper
                )
            return await loop.run_in_executor(self._pool, check, password, hashed)
        finally:
            self.pending -= 1

    async def waste(self, password: str) -> None:
        """Check `password` against a stand-in hash at the configured cost: the work a wrong
        password costs, for a login that has no user to check against (an unknown address)."""
        if self._stand_in is None:
            salt = bcrypt.gensalt(self.rounds)
            self._stand_in = await asyncio.get_running_loop().run_in_executor(
                self._pool, bcrypt.hashpw, os.urandom(16), salt
            )
        self.wasted += 1
        await self.check(password, self._stand_in)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _decoding_failed(users: Users, user: User, why: str) -> MatrixError:
    users.report_unusable_password(user, why)
    return MatrixError(500, M_UNKNOWN, "Password hash decoding failed")


def overloaded() -> MatrixError:
    """The 429 of a password check refused because too many wait (PasswordChecker's Overloaded)."""
    return MatrixError(
        429,
        M_LIMIT_EXCEEDED,
        "Too many logins in progress, try again shortly",
        headers={"Retry-After": "1"},
        retry_after_ms=1000,
    )


async def check_password(users: Users, checker: PasswordChecker, user: User, password: str) -> bool:
    """Rules 4-5: the password against the stored hash (or the store's own check, LDAP bind)."""
    verdict = await users.verify_password(user, password)
    if verdict is not None:
        return verdict
    # Rule 4: the stored text is the hex form of the bcrypt hash. One that is not (not
    # hex, or hex of something else) fails here, before it costs a password check.
    stored = user.password
    problem = "no password stored" if stored is None else stored_password_problem(stored)
    if stored is None or problem is not None:
        raise _decoding_failed(users, user, problem or "no password stored")
    hashed = bytes.fromhex(stored)
    # Rule 5: bcrypt, on the password pool, never on the event loop; with Synapse's pepper and
    # normalisation for a record moved from it (its `password_scheme`), and only for those.
    try:
        return await checker.check(password, hashed, scheme=user.password_scheme)
    except HashDecodeError as exc:
        raise _decoding_failed(users, user, str(exc)) from None
    except Overloaded:
        raise overloaded() from None


async def waste_password_check(users: Users, checker: PasswordChecker, password: str) -> None:
    """The work a wrong password costs, for a login with no user to check it against (an
    unknown name or address), so the time of the answer does not tell which exist: the
    store's own (an LDAP bind) where it checks passwords itself, else bcrypt's."""
    if await users.waste_password_check(password):
        return
    try:
        await checker.waste(password)
    except Overloaded:
        raise overloaded() from None
