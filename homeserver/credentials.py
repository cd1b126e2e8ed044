"""Credential fingerprints: what a session was opened with, as keyed digests.

A session belongs to the account and the credential it was opened with. At login two
short digests are kept with the session; every authenticated request compares them with
the digests of the user it just looked up (two string comparisons, no extra store trip):

- the **identity**: the entry's own identity where the store has one (LDAP entryUUID or
  objectGUID); in the users file and Redis, whose records carry none, the stored hash and
  the ident. A removed name added again is another account, whatever the sweep timing;
- the **password**: the stored hash (users file, Redis, LDAP hash mode's userPassword), or
  what changes with the password where the directory checks it (LDAP bind mode:
  pwdChangedTime / pwdLastSet, when exposed). `[sessions] end_on_password_change = false`
  stops comparing it; identity changes still end sessions.

The digests are BLAKE2b keyed with a key derived from the token signing secret, so the
session store never holds a hash (or anything a hash could be tried against) and no one
without the secret can tell two users' credentials apart. Keys of the previous secrets
(`[auth] previous_jwt_secrets`) are tried too, so a secret rotation ends no session.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Sequence
from dataclasses import dataclass

from backends.base import User
from backends.sessions.base import Session

DIGEST_SIZE = 16  # bytes; 32 hex digits
# Users whose fingerprints are remembered (the hot path then only compares two strings);
# past this the memory starts afresh.
CACHE_SIZE = 10_000
_LABEL = b"homeserver session credential fingerprint v1"


def _key(secret: str) -> bytes:
    return hmac.new(secret.encode("utf-8"), _LABEL, hashlib.sha256).digest()


@dataclass(frozen=True, slots=True)
class Fingerprint:
    identity: str
    password: str


def identity_material(user: User) -> str:
    if user.uid:
        return json.dumps(["uid", user.name, user.uid], separators=(",", ":"))
    return json.dumps(["record", user.name, user.password, user.ident], separators=(",", ":"))


def password_material(user: User) -> str:
    value = user.password if user.password is not None else user.password_stamp
    return json.dumps([user.name, value], separators=(",", ":"))


class Credentials:
    """Make and compare the fingerprints of users' credentials."""

    def __init__(self, secret: str, previous: Sequence[str] = (), *, end_on_password_change: bool = True) -> None:
        self.keys = [_key(secret), *(_key(s) for s in previous if s != secret)]
        self.end_on_password_change = end_on_password_change
        # The last record seen per name and its fingerprints: a backend that keeps its records
        # (the users file) hands back the same object each time, found without comparing it.
        self._cache: dict[str, tuple[User, Fingerprint]] = {}

    @staticmethod
    def _digest(key: bytes, material: str) -> str:
        data = material.encode("utf-8", "surrogatepass")
        return hashlib.blake2b(data, key=key, digest_size=DIGEST_SIZE).hexdigest()

    def of(self, user: User) -> Fingerprint:
        """The fingerprints a new session of `user` is opened with (remembered per user record)."""
        cached = self._cache.get(user.name)
        if cached is not None and (cached[0] is user or cached[0] == user):
            return cached[1]
        key = self.keys[0]
        found = Fingerprint(self._digest(key, identity_material(user)), self._digest(key, password_material(user)))
        if len(self._cache) >= CACHE_SIZE:
            self._cache.clear()
        self._cache[user.name] = (user, found)
        return found

    def accepted(self, user: User) -> tuple[list[str], list[str] | None]:
        """The identity digests and (unless password changes are let pass: None) the password
        digests under every key a session of `user` may still carry: what `end_stale` keeps."""
        identity, password = identity_material(user), password_material(user)
        identities = [self._digest(key, identity) for key in self.keys]
        passwords = [self._digest(key, password) for key in self.keys] if self.end_on_password_change else None
        return identities, passwords

    def _older_key_matches(self, stored: str, material: str) -> bool:
        """A session opened before a secret rotation carries digests made with an older key."""
        return any(hmac.compare_digest(stored, self._digest(key, material)) for key in self.keys[1:])

    def stale(self, session: Session, user: User) -> str | None:
        """Why `session` no longer belongs to `user` ("account_replaced", "password_changed"),
        or None while it does. Sessions opened before fingerprints were kept always do."""
        if session.identity_fp is None:
            return None
        return self.changed(session.identity_fp, session.password_fp, user)

    def changed(self, identity_fp: str, password_fp: str | None, user: User) -> str | None:
        """Why what was opened with these digests (a session, the account page's sign-in) no
        longer belongs to `user` ("account_replaced", "password_changed"), or None."""
        current = self.of(user)
        if identity_fp != current.identity and not self._older_key_matches(identity_fp, identity_material(user)):
            # A record without an identity of its own (users file, Redis) changes identity
            # with its hash: name it after the password when that is what changed (a reset,
            # or a new account under the name with a new password: the two look alike).
            if user.uid is None and password_fp is not None and self._password_differs(password_fp, user):
                return "password_changed"
            return "account_replaced"
        if self.end_on_password_change and password_fp is not None and self._password_differs(password_fp, user):
            return "password_changed"
        return None

    def _password_differs(self, password_fp: str, user: User) -> bool:
        return password_fp != self.of(user).password and not self._older_key_matches(
            password_fp, password_material(user)
        )
