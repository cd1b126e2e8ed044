"""The user record and the small async interface every user backend implements."""

from __future__ import annotations

import abc
import os
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True, slots=True)
class User:
    """A stored account, read only. `password` is the hex text of a bcrypt hash.

    A backend that checks passwords itself (LDAP bind mode) leaves `password` as None
    and answers `verify_password`.

    `locked`: the account is locked or disabled in the store (reversible; its sessions
    stay). `uid` and `password_stamp` let the service tell a replaced account or a changed
    password from the same one (the fingerprint of a session): `uid` is the entry's own
    identity where the store has one (LDAP entryUUID / objectGUID), `password_stamp` what
    changes with the password where the store checks passwords itself (LDAP bind mode:
    pwdChangedTime / pwdLastSet). Both None where the store has no such thing.

    `password_scheme`: how the stored hash is checked: None for this server's bcrypt, "synapse"
    for a hash moved from a Synapse (`migrate-synapse run`), checked as Synapse checks it
    (its pepper and Unicode normalisation; homeserver.synapse_passwords). Only the users
    file and Redis carry it; a new password set with add-user drops it.

    `admin`: the store makes the user an administrator (a record's or hash's `admin`, an
    LDAP entry matching `admin_filter`); `mfa_required`: the user must have a second factor
    (a record's or hash's `mfa_required`, an entry matching `mfa_required_filter`).
    """

    name: str
    ident: str
    password: str | None = None
    display_name: str | None = None
    avatar_url: str | None = None
    email: str | None = None  # an address the user may log in with (m.id.thirdparty)
    locked: bool = False
    uid: str | None = None
    password_stamp: str | None = None
    admin: bool = False
    mfa_required: bool = False
    password_scheme: str | None = None


# The password schemes a record may name (`User.password_scheme`): Synapse's.
SYNAPSE_SCHEME = "synapse"
PASSWORD_SCHEMES = (SYNAPSE_SCHEME,)

# The yes-or-no fields of a record: true when set, left out of the record when not.
FLAG_FIELDS = ("locked", "admin", "mfa_required")
# The fields a users-file record or a Redis user hash holds (add-user writes them); `uid`
# and `password_stamp` come from directories only.
STORED_FIELDS = ("name", "password", "ident", "display_name", "avatar_url", "email", *FLAG_FIELDS, "password_scheme")


def stored_fields(user: User) -> dict[str, object]:
    """The record fields of `user` as add-user writes them; None leaves a field out (an
    unlocked account carries no `locked`, a user who is no admin no `admin`)."""
    fields: dict[str, object] = {name: getattr(user, name) for name in STORED_FIELDS}
    for flag in FLAG_FIELDS:
        fields[flag] = True if fields[flag] else None
    return fields


def password_scheme_problem(scheme: object) -> str | None:
    """Why a record's `password_scheme` cannot be used; None when it can (absent included)."""
    if scheme is None or scheme in PASSWORD_SCHEMES:
        return None
    return f"must be {' or '.join(repr(s) for s in PASSWORD_SCHEMES)}, not {scheme!r}"


def kept_fields(keep: Collection[str]) -> set[str]:
    """The fields an overwrite keeps as stored: `keep`, and with the password its scheme (a
    hash moved from Synapse stays Synapse's); a new password drops the scheme."""
    kept = set(keep)
    if "password" in kept:
        kept.add("password_scheme")
    return kept


def resolve_path(path: str, config_dir: str) -> str:
    """A path from a config section, taken relative to the config file's folder."""
    return path if os.path.isabs(path) else os.path.join(config_dir, path)


def canonical_email(address: str) -> str | None:
    """The form addresses are matched in, as Synapse's `canonicalise_email`: the domain
    lower-cased, the local part case-folded; None for text that is no address."""
    local, at, domain = address.strip().rpartition("@")
    if not at or not local or not domain or "@" in local:
        return None
    return local.casefold() + "@" + domain.lower()


class UserBackend(abc.ABC):
    """Fetch users from a store. Backends never change accounts while serving."""

    #: the name under which the backend is registered (`[backend] type`)
    name: ClassVar[str] = ""

    @classmethod
    @abc.abstractmethod
    def from_config(cls, options: dict[str, Any], *, config_dir: str) -> UserBackend:
        """Build the backend from its validated `[backend.<name>]` section.

        Raise `ConfigError` for a start-up problem (missing file,
        malformed data), naming the key or the record.
        """

    async def start(self) -> None:
        """Open connections or load data; called once in the serving process."""

    async def changed_accounts(self) -> AsyncIterator[dict[str, list[str]]]:
        """The accounts whose password, ident or lock changed ({name: the fields changed}), as
        the backend learns of them, so the service acts at once (ends the sessions of a reset
        account) instead of at the account's next request. Only a backend that holds a copy
        and reads it again (the users file) knows; the others end at once, and the sweep
        finds their changes."""
        return
        yield

    @abc.abstractmethod
    async def get_user(self, name: str, *, case_insensitive: bool = False) -> User | None:
        """Return the user whose name is exactly `name`, or None.

        With `case_insensitive`, a failed exact lookup falls back to a case-insensitive
        match (each backend documents how). Raise `StoreUnavailable` when the store
        cannot answer and `StoreDataError` for a malformed record.
        """

    async def list_users(self) -> list[User]:
        """Every user of the store, whole, read without holding the event loop.

        One User per name `get_user` answers for, with every field a lookup gives (the
        profile's display name, ident and avatar, the e-mail address, locked, admin,
        mfa_required), so a caller needs no second lookup per user. Names are as stored;
        a caller that hands them to Matrix still checks them (homeserver.names). Raise
        `StoreIncomplete`, never a shorter list, when the whole store could not be read
        (the store down or failing part-way, a server limit hit, a referral not followed,
        a users file that does not parse, a malformed record).
        """
        raise NotImplementedError(f"the {self.name} backend cannot list its users")

    async def get_users_by_email(self, address: str) -> list[User]:
        """Every user holding this e-mail address (canonical form, see `canonical_email`).

        The caller logs in only when exactly one holds it. A backend without addresses
        finds nobody.
        """
        return []

    async def verify_password(self, user: User, password: str) -> bool | None:
        """Check the password in the store itself; None leaves it to the stored hash."""
        return None

    async def waste_password_check(self, password: str) -> bool:
        """For a name or address the store does not have: the work a wrong password costs in
        the store itself (a backend that answers `verify_password`), so the time of the
        refusal does not tell which names exist; False when passwords are checked against
        the stored hash (the service then spends a bcrypt check instead)."""
        return False

    async def check_health(self) -> None:
        """Raise `StoreUnavailable` when the store cannot answer right now."""

    async def reload(self) -> bool:
        """Read the store again where the backend holds a copy (SIGHUP); True if it did."""
        return False

    async def set_locked(self, name: str, locked: bool) -> bool:
        """Lock or unlock a user (the CLI's lock / unlock; never called while serving); False
        when there is no such user."""
        raise NotImplementedError(f"the {self.name} backend cannot lock users")

    async def add_user(self, user: User, *, overwrite: bool = False, keep: Collection[str] = ()) -> bool:
        """Provision a user (the CLI's add-user; never called while serving); True if one was replaced.

        An existing user is refused (`UserExists`) unless `overwrite`; then the fields of
        `user` replace the stored ones (a None removes one), except the fields named in
        `keep`, which stay as stored, and fields the record has that `User` does not know.
        Keeping `password` or `ident` of a user that does not exist is `UserIncomplete`.
        """
        raise NotImplementedError(f"the {self.name} backend cannot add users")

    async def add_users(self, users: list[User]) -> list[str]:
        """Provision many users at once, those the store does not have (a move from Synapse;
        never called while serving): one write where the store can (the users file: one
        rewrite; Redis: one MULTI/EXEC on a standalone server), so a failure leaves all of
        them or none. A name the store has keeps its record. The names added."""
        raise NotImplementedError(f"the {self.name} backend cannot add users")

    async def close(self) -> None:
        """Release connections."""


class UserExists(Exception):
    """add_user found the name taken and was not asked to overwrite."""


class UserIncomplete(Exception):
    """add_user was told to keep required fields of a user that does not exist."""

    def __init__(self, name: str, fields: list[str]) -> None:
        super().__init__(f"user {name!r} does not exist, so {' and '.join(fields)} cannot be kept")
        self.fields = fields


class StoreUnavailable(Exception):
    """The user store cannot be reached or timed out; answered with 503 and Retry-After."""

    def __init__(
        self, message: str = "User store unavailable", retry_after: int = 5, *, store: str = "user store"
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.store = store  # which store: "user store" or "session store"


class StoreIncomplete(Exception):
    """`list_users` could not read the whole store; a caller must not take a user missing
    from `users` as gone (the sweep deactivates no one).

    `str()` is one line saying why (no secrets). `users`: the users that were read, which
    are sound and may still be used (provisioned); `unreadable`: names found in the store
    whose records could not be used (malformed), so they are not gone either.
    """

    def __init__(self, reason: str, *, users: list[User] | None = None, unreadable: list[str] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.users: list[User] = users or []
        self.unreadable: list[str] = unreadable or []


class StoreDataError(Exception):
    """A record in the user store is malformed; an operator error answered with 500."""


class ConfigError(Exception):
    """A start-up configuration problem, reported as one line naming the key."""
