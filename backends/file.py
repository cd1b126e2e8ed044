"""JSON-file user backend: the embedded default, held in memory and reloaded when the file changes."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import tempfile
from typing import Any, Iterator

from tornado.ioloop import PeriodicCallback

from backends.base import ConfigError, User, UserBackend, UserExists, canonical_email

logger = logging.getLogger(__name__)

REQUIRED = ("name", "password", "ident")
OPTIONAL = ("display_name", "avatar_url", "email")


def parse_users(document: Any, source: str) -> dict[str, User]:
    """Validate a `{"users": [...]}` document into {name: User}; ConfigError names the record."""
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
        if record["name"] in users:
            raise ConfigError(f"{where}: duplicate name")
        users[record["name"]] = User(
            name=record["name"],
            password=record["password"],
            ident=record["ident"],
            display_name=record.get("display_name"),
            avatar_url=record.get("avatar_url"),
            email=record.get("email"),
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


def read_users_file(path: str) -> dict[str, User]:
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
    return parse_users(document, path)


Signature = tuple[int, int, int, int]
_UNSET = object()


def file_signature(path: str) -> Signature | None:
    """What tells one version of the file from another: device, inode, size, mtime (None if missing)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def read_versioned(path: str) -> tuple[Signature | None, dict[str, User] | ConfigError]:
    """Read and validate the file, with the signature taken before reading.

    Stat first: a write landing between stat and read then shows up as a new signature
    at the next poll, so no change is ever missed. A bad file gives its ConfigError.
    """
    signature = file_signature(path)
    try:
        return signature, read_users_file(path)
    except ConfigError as exc:
        return signature, exc


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """Serialise writers (concurrent add-user runs) with a lock file beside the users file."""
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _user_record(user: User) -> dict[str, str]:
    record = {"name": user.name, "password": user.password or "", "ident": user.ident}
    if user.display_name is not None:
        record["display_name"] = user.display_name
    if user.avatar_url is not None:
        record["avatar_url"] = user.avatar_url
    if user.email is not None:
        record["email"] = user.email
    return record


def write_atomically(path: str, data: bytes, mode: int = 0o600) -> None:
    """Replace `path` with `data` so readers see the old or the new file, never half."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".users-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
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

    def __init__(self, path: str, reload_interval: float = 0.0) -> None:
        self.path = path
        self.reload_interval = reload_interval
        self.users: dict[str, User] = {}
        self.folded: dict[str, str] = {}
        self.emails: dict[str, list[str]] = {}
        self.signature: Signature | None = None
        # The signature of the last version that failed to load, so it is reported once.
        self._bad_signature: object = _UNSET
        self._reloading = False
        self._poller: PeriodicCallback | None = None

    @classmethod
    def from_config(cls, options: dict[str, Any], *, config_dir: str) -> "FileBackend":
        path = options["path"]
        return cls(
            path if os.path.isabs(path) else os.path.join(config_dir, path),
            reload_interval=options["reload_interval"],
        )

    def _install(self, signature: Signature | None, users: dict[str, User]) -> None:
        # Both assignments happen on the event loop with no await between them, so a
        # request sees the old or the new users, never a mix.
        self.users, self.folded, self.emails = users, fold_index(users), email_index(users)
        self.signature = signature
        self._bad_signature = _UNSET

    async def start(self) -> None:
        """Load the file (a start-up error if it is bad), then poll it if configured."""
        signature, users = await asyncio.get_running_loop().run_in_executor(None, read_versioned, self.path)
        if isinstance(users, ConfigError):
            raise users
        self._install(signature, users)
        logger.info("loaded %d users from %s", len(self.users), self.path)
        if self.reload_interval > 0 and self._poller is None:
            self._poller = PeriodicCallback(self._poll, self.reload_interval * 1000, jitter=0.1)
            self._poller.start()

    async def _poll(self) -> None:
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
            signature, users = await loop.run_in_executor(None, read_versioned, self.path)
            if isinstance(users, ConfigError):
                if force or signature != self._bad_signature:
                    logger.error("users file not reloaded, keeping the %d users loaded before: %s", len(self.users), users)
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
        user = self.users.get(name)
        if user is None and case_insensitive:
            stored = self.folded.get(name.casefold())
            user = self.users.get(stored) if stored is not None else None
        return user

    async def get_users_by_email(self, address: str) -> list[User]:
        return [self.users[name] for name in self.emails.get(address, [])]

    async def add_user(self, user: User, *, overwrite: bool = False) -> None:
        with _locked(self.path):
            try:
                with open(self.path, "rb") as fh:
                    document = json.load(fh)
                mode = os.stat(self.path).st_mode & 0o777
            except FileNotFoundError:
                document, mode = {"users": []}, 0o600
            except ValueError as exc:
                raise ConfigError(f"users file {self.path}: malformed JSON: {exc}") from None
            parse_users(document, self.path)  # refuse to build on a broken file
            records = document["users"]
            existing = [i for i, r in enumerate(records) if r["name"] == user.name]
            if existing and not overwrite:
                raise UserExists(user.name)
            if existing:
                records[existing[0]] = _user_record(user)
            else:
                records.append(_user_record(user))
            data = json.dumps(document, indent=2, ensure_ascii=False).encode("utf-8") + b"\n"
            write_atomically(self.path, data, mode)
