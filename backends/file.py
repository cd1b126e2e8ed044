"""JSON-file user backend: the embedded default, held in memory and reloaded when the file changes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import stat
import time
from collections.abc import AsyncIterator, Collection
from typing import Any

from tornado.ioloop import PeriodicCallback

from backends import file_writer
from backends.base import ConfigError, StoreIncomplete, User, UserBackend, canonical_email, resolve_path
from backends.file_writer import write_atomically as write_atomically  # where tests and tools found it
from backends.local_disk import on_local_disk
from backends.secret_file import warn_if_exposed
from backends.users_file import parse_users

logger = logging.getLogger(__name__)

__all__ = ["FileBackend", "email_index", "fold_index", "parse_users", "read_users_file", "write_atomically"]


def email_index(users: dict[str, User]) -> dict[str, list[str]]:
    """Map canonical e-mail addresses to the names holding them (more than one: ambiguous)."""
    index: dict[str, list[str]] = {}
    for user in users.values():
        address = canonical_email(user.email) if user.email else None
        if address is not None:
            index.setdefault(address, []).append(user.name)
    return index


def fold_index(users: dict[str, User]) -> dict[str, str]:
    """Map case-folded names to their stored name, keeping only unambiguous ones."""
    seen: dict[str, str | None] = {}
    for name in users:
        key = name.casefold()
        seen[key] = None if key in seen else name
    return {key: name for key, name in seen.items() if name is not None}


def read_users_file(path: str, check_passwords: bool = True) -> dict[str, User]:
    """Load and validate the users file; ConfigError on any problem."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise ConfigError(f"backend.file.path: users file {path} not found") from None
    except OSError as exc:
        raise ConfigError(f"backend.file.path: users file {path} cannot be read ({exc.strerror})") from None
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"users file {path}: malformed JSON: {exc}") from None
    return parse_users(document, path, check_passwords=check_passwords)


Signature = tuple[int, int, int, int]
_UNSET = object()
# With polling on, a lookup checks the file's signature itself when the last check is older
# than this (seconds): a change (`run.py lock`, an edit) is seen by the next request, not
# only by the next poll; at most one stat per this interval and process.
FRESHNESS = 0.25


def file_signature(path: str) -> Signature | None:
    """What tells one version of the file from another: device, inode, size, mtime (None if missing)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def read_versioned(path: str, check_passwords: bool = True) -> tuple[Signature | None, dict[str, User] | ConfigError]:
    """Read and validate the file, with the signature taken before reading.

    Stat first: a write landing between stat and read then shows up as a new signature
    at the next poll, so no change is ever missed. A bad file gives its ConfigError.
    """
    signature = file_signature(path)
    try:
        return signature, read_users_file(path, check_passwords)
    except ConfigError as exc:
        return signature, exc


class FileBackend(UserBackend):
    """Users from a JSON file, held in memory with a case-folded index.

    With a `reload_interval` the file's signature is polled and a changed file is read
    again, off the event loop; `reload()` (SIGHUP) reads it at once. A file that fails to
    load leaves the last good users in place and is reported once per version.
    """

    name = "file"
    #: Warn at start of a users file others may read (it holds password hashes). The
    #: command-line tools turn it off: they read the file, or rewrite it private.
    warn_exposed = True

    def __init__(self, path: str, reload_interval: float = 0.0, check_passwords: bool = True) -> None:
        self.path = path
        self.reload_interval = reload_interval
        self.check_passwords = check_passwords
        self.users: dict[str, User] = {}
        self.folded: dict[str, str] = {}
        self.emails: dict[str, list[str]] = {}
        self.signature: Signature | None = None
        # The signature of the last version that failed to load, so it is reported once.
        self._bad_signature: object = _UNSET
        # One read-and-install at a time (the poller, a lookup's check, SIGHUP, a listing):
        # a lookup that finds the file changed while another reads it waits for that read,
        # rather than answering from the copy before it.
        self._reading = asyncio.Lock()
        self._poller: PeriodicCallback | None = None
        self._checked = 0.0  # time.monotonic() of the last check of the signature
        self._stat_inline = False  # the lookups' check stats on the loop (a local disk: start())
        # Accounts changed by reloads, until the service takes them (changed_accounts).
        self._changes: asyncio.Queue[dict[str, list[str]]] = asyncio.Queue()

    @classmethod
    def from_config(cls, options: dict[str, Any], *, config_dir: str) -> FileBackend:
        path = options["path"]
        return cls(
            resolve_path(path, config_dir),
            reload_interval=options["reload_interval"],
            check_passwords=options["check_passwords"],
        )

    def _install(self, signature: Signature | None, users: dict[str, User]) -> None:
        # Both assignments happen on the event loop with no await between them, so a
        # request sees the old or the new users, never a mix.
        before = self.users
        self.users, self.folded, self.emails = users, fold_index(users), email_index(users)
        self.signature = signature
        self._bad_signature = _UNSET
        if before:
            changed = {}
            for name, user in users.items():
                old = before.get(name)
                fields = [f for f in ("password", "ident", "locked") if old and getattr(old, f) != getattr(user, f)]
                if fields:
                    changed[name] = fields
            if changed:
                self._changes.put_nowait(changed)

    async def changed_accounts(self) -> AsyncIterator[dict[str, list[str]]]:
        """The accounts each reload found changed, one reload's at a time, until cancelled."""
        while True:
            yield await self._changes.get()

    async def start(self) -> None:
        """Load the file (a start-up error if it is bad), then poll it if configured."""
        signature, users = await asyncio.get_running_loop().run_in_executor(
            None, read_versioned, self.path, self.check_passwords
        )
        if isinstance(users, ConfigError):
            raise users
        self._install(signature, users)
        logger.info("loaded %d users from %s", len(self.users), self.path)
        if self.warn_exposed:
            with contextlib.suppress(OSError):
                warn_if_exposed("backend.file.path", self.path, os.stat(self.path).st_mode, exposed=stat.S_IRWXO)
        if self.reload_interval > 0 and self._poller is None:
            # Read off the loop as the file is: the mount table is small, but start() is a coroutine.
            self._stat_inline = await asyncio.get_running_loop().run_in_executor(None, on_local_disk, self.path)
            self._poller = PeriodicCallback(self._poll, self.reload_interval * 1000, jitter=0.1)
            self._poller.start()

    async def _poll(self) -> None:
        self._checked = time.monotonic()
        try:
            await self.reload(force=False)
        except Exception:  # the poller must survive anything, or reloading stops for good
            logger.exception("checking users file %s failed", self.path)

    async def _fresh(self) -> None:
        """A lookup's check of the file. On a local disk the signature is taken here, on the
        loop (one stat, a few microseconds; a round trip to a thread cost 4-6 % of the CPU a
        request under the realistic mix, docs/performance.md), and the file read off the loop
        only when it changed; elsewhere (a network filesystem) all of it off the loop."""
        if not self._stat_inline:
            await self._poll()
            return
        self._checked = time.monotonic()
        if file_signature(self.path) not in (self.signature, self._bad_signature):
            await self._poll()

    async def reload(self, force: bool = True) -> bool:
        """Read the file again (only if its signature changed, unless `force`); True if reloaded."""
        async with self._reading:
            loop = asyncio.get_running_loop()
            if not force:
                signature = await loop.run_in_executor(None, file_signature, self.path)
                if signature == self.signature or signature == self._bad_signature:
                    return False
            signature, users = await loop.run_in_executor(None, read_versioned, self.path, self.check_passwords)
            if isinstance(users, ConfigError):
                if force or signature != self._bad_signature:
                    logger.error(
                        "users file not reloaded, keeping the %d users loaded before: %s", len(self.users), users
                    )
                self._bad_signature = signature
                return False
            self._reloaded(signature, users)
            return True

    def _reloaded(self, signature: Signature | None, users: dict[str, User]) -> None:
        before = len(self.users)
        self._install(signature, users)
        logger.info("reloaded users file %s: %d users (was %d)", self.path, len(users), before)

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.stop()
            self._poller = None

    async def get_user(self, name: str, *, case_insensitive: bool = False) -> User | None:
        if self._poller is not None and time.monotonic() - self._checked >= FRESHNESS:
            await self._fresh()
        user = self.users.get(name)
        if user is None and case_insensitive:
            stored = self.folded.get(name.casefold())
            user = self.users.get(stored) if stored is not None else None
        return user

    async def list_users(self) -> list[User]:
        """The users of the file as it is now, off the loop: the copy in memory when the file
        is the version it was read from, else the file read again. A file that is missing,
        does not parse or fails its checks (an editor mid-write, a typo) is `StoreIncomplete`,
        never the last good copy: that is what the server keeps serving, not the store.

        A version newer than the copy in memory is installed as a reload would, before the
        listing is returned: what a sweep tells Synapse (an unlock, a new user) this server's
        own lookups see already, never a moment after."""
        loop = asyncio.get_running_loop()
        async with self._reading:
            signature = await loop.run_in_executor(None, file_signature, self.path)
            if signature is not None and signature == self.signature:
                return list(self.users.values())
            signature, users = await loop.run_in_executor(None, read_versioned, self.path, self.check_passwords)
            if isinstance(users, ConfigError):
                raise StoreIncomplete(str(users))
            if self.signature is not None:  # a backend never started (a command's) serves nothing to update
                self._reloaded(signature, users)
            return list(users.values())

    async def get_users_by_email(self, address: str) -> list[User]:
        if self._poller is not None and time.monotonic() - self._checked >= FRESHNESS:
            await self._fresh()
        return [self.users[name] for name in self.emails.get(address, [])]

    async def set_locked(self, name: str, locked: bool) -> bool:
        """Set or clear the record's `locked`; a running server sees it at its next request (with
        polling on: `FRESHNESS`), else at its next reload (SIGHUP)."""
        return file_writer.set_locked(self.path, name, locked)

    async def add_user(self, user: User, *, overwrite: bool = False, keep: Collection[str] = ()) -> bool:
        return file_writer.add_user(self.path, user, overwrite=overwrite, keep=keep)

    async def add_users(self, users: list[User]) -> list[str]:
        """One rewrite, off the loop; the copy in memory is read again (this process sees them)."""
        added = await asyncio.get_running_loop().run_in_executor(None, file_writer.add_users, self.path, users)
        if added:
            await self.reload()
        return added
