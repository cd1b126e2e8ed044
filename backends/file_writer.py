"""Changing the users file (`add-user`, `lock`, `unlock`): whole-file rewrites, atomic and
serialised, that keep the file's owner and never leave it readable by others.

The server only reads the file (`backends.file`); these run in the command-line process.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import json
import os
import pwd
import stat
import tempfile
from collections.abc import Collection, Iterator
from typing import Any

from backends.base import ConfigError, User, UserExists, UserIncomplete, kept_fields, stored_fields
from backends.users_file import parse_users

# A users file holds password hashes: one the commands create is the owner's alone.
NEW_FILE_MODE = 0o600


def kept_mode(mode: int) -> int:
    """The mode a rewritten file keeps: the old one without any access for others.

    The group's access stays: the documented set-up is `root:homeserver 0640`, where the
    service reads the file through its group. A stricter mode (0600, 0400) stays as it is.
    """
    return stat.S_IMODE(mode) & ~stat.S_IRWXO


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


def write_atomically(path: str, data: bytes, mode: int = NEW_FILE_MODE, owner: tuple[int, int] | None = None) -> None:
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


def _write_document(path: str, document: dict[str, Any], st: os.stat_result | None) -> None:
    data = json.dumps(document, indent=2, ensure_ascii=False).encode("utf-8") + b"\n"
    if st is None:
        write_atomically(path, data, NEW_FILE_MODE)
    else:
        write_atomically(path, data, kept_mode(st.st_mode), owner=(st.st_uid, st.st_gid))


def add_user(path: str, user: User, *, overwrite: bool = False, keep: Collection[str] = ()) -> bool:
    """Add `user` to the users file at `path` (made if missing), or with `overwrite` replace
    the record of that name; True if one was replaced. See `UserBackend.add_user`."""
    # Write where a symlinked users file really lives, not over the link.
    path = os.path.realpath(path)
    with _locked(path):
        document, st = _read_for_update(path)
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
            records[index] = _replace_record(records[index], user, kept_fields(keep))
        _write_document(path, document, st)
    return index is not None


def add_users(path: str, users: list[User]) -> list[str]:
    """Add the users the file at `path` (made if missing) does not have, in one rewrite; a name
    it has keeps its record. The names added."""
    path = os.path.realpath(path)
    with _locked(path):
        document, st = _read_for_update(path)
        records = document["users"]
        present = {record["name"] for record in records}
        added = [user for user in users if user.name not in present]
        if added:
            records.extend(_user_record(user) for user in added)
            _write_document(path, document, st)
    return [user.name for user in added]


def set_locked(path: str, name: str, locked: bool) -> bool:
    """Set or clear the record's `locked`; False if there is no user `name`."""
    path = os.path.realpath(path)
    with _locked(path):
        document, st = _read_for_update(path)
        record = next((r for r in document["users"] if r["name"] == name), None)
        if record is None:
            return False
        if locked:
            record["locked"] = True
        else:
            record.pop("locked", None)
        _write_document(path, document, st)
    return True
