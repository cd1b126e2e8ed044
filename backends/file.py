"""JSON-file user backend: the embedded default, held in memory and reloaded when the file changes."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import grp
import json
import logging
import os
import pwd
import tempfile
import time
from collections.abc import Collection, Iterator
from typing import Any

from tornado.ioloop import PeriodicCallback

from backends.base import (
    ConfigError,
    User,
    UserBackend,
    UserExists,
    UserIncomplete,
    canonical_email,
    resolve_path,
    stored_fields,
)
from backends.hashes import operator_mistake

logger = logging.getLogger(__name__)

REQUIRED = ("name", "password", "ident")
OPTIONAL = ("display_name", "avatar_url", "email")


def parse_users(document: Any, source: str, *, check_passwords: bool = True) -> dict[str, User]:
    """Validate a `{"users": [...]}` document into {name: User}; ConfigError names the record.

    With `check_passwords`, a password that is plainly an operator's slip (a bcrypt hash
    as plain text, or hex of something that is no bcrypt hash) is such an error too, so
    it stops start-up instead of failing every login of that user. Text that is not hex
    at all loads, and its logins answer the specification's rule 4.
    """
    if not isinstance(document, dict) or not isinstance(document.get("users"), list):
        raise ConfigError(f"users file {source}: expected an object with a \"users\" list")
    users: dict[str, User] = {}
    for index, record in enumerate(document["users"]):
        where = f"users file {source}: record {index}"
        if not isinstance(record, dict):
            raise ConfigError(f"{where}: expected an object")
        if isinstance(record.get("name"), str):
            where = f"{where} ({record['name']!r})"
        for key in REQUIRED:
            if key not in record:
                raise ConfigError(f"{where}: missing required field {key!r}")
            if not isinstance(record[key], str):
                raise ConfigError(f"{where}: field {key!r} must be a string")
        for key in OPTIONAL:
            if record.get(key) is not None and not isinstance(record[key], str):
                raise ConfigError(f"{where}: field {key!r} must be a string")
        if record.get("locked") is not None and not isinstance(record["locked"], bool):
            raise ConfigError(f"{where}: field 'locked' must be true or false")
        if record["name"] in users:
            raise ConfigError(f"{where}: duplicate name")
        problem = operator_mistake(record["password"]) if check_passwords else None
        if problem is not None:
            raise ConfigError(f"{where}: field 'password' cannot be used: {problem}")
        users[record["name"]] = User(
            name=record["name"],
            password=record["password"],
            ident=record["ident"],
            display_name=record.get("display_name"),
            avatar_url=record.get("avatar_url"),
            email=record.get("email"),
            locked=record.get("locked") is True,
        )
    return users


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


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """Serialise writers (concurrent add-user runs) with a lock on the users file's folder.

    No lock file: it would be left beside the users file (which may be tracked in git).
    Not a lock on the users file either: each writer replaces it by a rename, so a writer
    that waited on the old file would hold a lock on an inode no one else uses. The folder
    stays put. Readers take no lock: they see the old file or the new one, whole.
    """
    folder = os.path.dirname(path)
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise ConfigError(f"users file {path}: cannot open its folder ({exc.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _user_fields(user: User) -> dict[str, Any]:
    """The record's fields as add-user sets them (None: the field is left out)."""
    return stored_fields(user)


def _user_record(user: User) -> dict[str, Any]:
    record = {key: value for key, value in _user_fields(user).items() if value is not None}
    record.setdefault("password", "")
    return record


def _replace_record(old: dict[str, Any], user: User, keep: Collection[str]) -> dict[str, Any]:
    """The old record with the fields of `user` set (None removes one), except those in `keep`.

    Keys add-user does not know stay as they were.
    """
    record = dict(old)
    for key, value in _user_fields(user).items():
        if key in keep:
            continue
        if value is None:
            record.pop(key, None)
        else:
            record[key] = value
    return record


def _owner_text(uid: int, gid: int) -> str:
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    try:
        group = grp.getgrgid(gid).gr_name
    except KeyError:
        group = str(gid)
    return f"{user}:{group}"


def write_atomically(path: str, data: bytes, mode: int = 0o600, owner: tuple[int, int] | None = None) -> None:
    """Replace `path` with `data` so readers see the old or the new file, never half.

    `owner` (uid, gid) is given to the new file before it takes the old one's place, so a
    `root:homeserver 0640` users file stays readable by the service after root edits it.
    """
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".users-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
            st = os.fstat(fh.fileno())
        if owner is not None and (st.st_uid, st.st_gid) != owner:
            try:
                os.chown(tmp, *owner)  # before chmod: chown clears set-id bits
            except PermissionError:
                raise ConfigError(
                    f"users file {path}: cannot keep its owner {_owner_text(*owner)}; "
                    "run add-user as root or as that user"
                ) from None
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


class FileBackend(UserBackend):
    """Users from a JSON file, held in memory with a case-folded index.

    With a `reload_interval` the file's signature is polled and a changed file is read
    again, off the event loop; `reload()` (SIGHUP) reads it at once. A file that fails to
    load leaves the last good users in place and is reported once per version.
    """

    name = "file"

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
        self._reloading = False
        self._poller: PeriodicCallback | None = None
        self._checked = 0.0  # time.monotonic() of the last check of the signature

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
        if before and self.on_change is not None:
            changed = {}
            for name, user in users.items():
                old = before.get(name)
                fields = [f for f in ("password", "ident", "locked") if old and getattr(old, f) != getattr(user, f)]
                if fields:
                    changed[name] = fields
            if changed:
                self.on_change(changed)

    async def start(self) -> None:
        """Load the file (a start-up error if it is bad), then poll it if configured."""
        signature, users = await asyncio.get_running_loop().run_in_executor(
            None, read_versioned, self.path, self.check_passwords
        )
        if isinstance(users, ConfigError):
            raise users
        self._install(signature, users)
        logger.info("loaded %d users from %s", len(self.users), self.path)
        if self.reload_interval > 0 and self._poller is None:
            self._poller = PeriodicCallback(self._poll, self.reload_interval * 1000, jitter=0.1)
            self._poller.start()

    async def _poll(self) -> None:
        self._checked = time.monotonic()
        try:
            await self.reload(force=False)
        except Exception:  # the poller must survive anything, or reloading stops for good
            logger.exception("checking users file %s failed", self.path)

    async def reload(self, force: bool = True) -> bool:
        """Read the file again (only if its signature changed, unless `force`); True if reloaded."""
        if self._reloading:
            return False
        self._reloading = True
        try:
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
            before = len(self.users)
            self._install(signature, users)
            logger.info("reloaded users file %s: %d users (was %d)", self.path, len(users), before)
            return True
        finally:
            self._reloading = False

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.stop()
            self._poller = None

    async def get_user(self, name: str, *, case_insensitive: bool = False) -> User | None:
        if self._poller is not None and time.monotonic() - self._checked >= FRESHNESS:
            await self._poll()
        user = self.users.get(name)
        if user is None and case_insensitive:
            stored = self.folded.get(name.casefold())
            user = self.users.get(stored) if stored is not None else None
        return user

    async def get_users_by_email(self, address: str) -> list[User]:
        if self._poller is not None and time.monotonic() - self._checked >= FRESHNESS:
            await self._poll()
        return [self.users[name] for name in self.emails.get(address, [])]

    async def set_locked(self, name: str, locked: bool) -> bool:
        """Set or clear the record's `locked`; a running server sees it at its next request (with
        polling on: `FRESHNESS`), else at its next reload (SIGHUP)."""
        path = os.path.realpath(self.path)
        with _locked(path):
            document, st = self._read_for_update(path)
            record = next((r for r in document["users"] if r["name"] == name), None)
            if record is None:
                return False
            if locked:
                record["locked"] = True
            else:
                record.pop("locked", None)
            self._write_document(path, document, st)
        return True

    @staticmethod
    def _read_for_update(path: str) -> tuple[dict[str, Any], os.stat_result | None]:
        """The users file as JSON and its stat (None when missing), checked as a whole."""
        try:
            with open(path, "rb") as fh:
                document = json.load(fh)
                st: os.stat_result | None = os.fstat(fh.fileno())
        except FileNotFoundError:
            document, st = {"users": []}, None
        except ValueError as exc:
            raise ConfigError(f"users file {path}: malformed JSON: {exc}") from None
        # Refuse to build on a broken file; a bad password elsewhere is no reason to
        # refuse, and replacing that very record is how it gets fixed.
        parse_users(document, path, check_passwords=False)
        return document, st

    @staticmethod
    def _write_document(path: str, document: dict[str, Any], st: os.stat_result | None) -> None:
        data = json.dumps(document, indent=2, ensure_ascii=False).encode("utf-8") + b"\n"
        if st is None:
            write_atomically(path, data, 0o600)
        else:
            write_atomically(path, data, st.st_mode & 0o777, owner=(st.st_uid, st.st_gid))

    async def add_user(self, user: User, *, overwrite: bool = False, keep: Collection[str] = ()) -> bool:
        # Write where a symlinked users file really lives, not over the link.
        path = os.path.realpath(self.path)
        with _locked(path):
            document, st = self._read_for_update(path)
            records = document["users"]
            index = next((i for i, r in enumerate(records) if r["name"] == user.name), None)
            if index is not None and not overwrite:
                raise UserExists(user.name)
            if index is None:
                missing = [key for key in ("password", "ident") if key in keep]
                if missing:
                    raise UserIncomplete(user.name, missing)
                records.append(_user_record(user))
            else:
                records[index] = _replace_record(records[index], user, keep)
            self._write_document(path, document, st)
        return index is not None
