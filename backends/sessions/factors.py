"""What the second factors keep (homeserver.mfa): each person's factors (authenticator apps,
passkeys, one set of recovery codes) and the short-lived WebAuthn challenges. A small
interface beside the SessionStore, to be implemented on the same SQLite file or Redis.

Nothing here is usable on its own: a TOTP secret is kept sealed (AES-GCM under the
operator's key, homeserver.mfa.sealing), recovery codes as keyed digests, a passkey as its
public key. The interface only stores and compares; every rule lives in homeserver.mfa.
"""

from __future__ import annotations

import abc
import hashlib
import json
from base64 import b64decode, b64encode
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal

# The kinds of factor. A person has any number of authenticator apps and passkeys, and at
# most one set of recovery codes (renewing them replaces the set).
FactorKind = Literal["totp", "webauthn", "recovery"]
TOTP: Final = "totp"
WEBAUTHN: Final = "webauthn"
RECOVERY: Final = "recovery"
KINDS: tuple[FactorKind, ...] = (TOTP, WEBAUTHN, RECOVERY)

# What a challenge was made for: adding a passkey, or the sign-in's second step with one; or
# the pending sign-in itself (homeserver.mfa.second_step), taken once when it is finished.
ChallengePurpose = Literal["register", "authenticate", "sign_in"]
REGISTER: Final = "register"
AUTHENTICATE: Final = "authenticate"
SIGN_IN: Final = "sign_in"

_BYTES_FIELDS = ("sealed_secret", "credential_id", "public_key")


@dataclass(frozen=True, slots=True)
class Factor:
    """One second factor of one person.

    Which fields mean something depends on `kind`: a TOTP factor has `sealed_secret` and
    `last_step`; a passkey has `credential_id`, `public_key` (COSE), `sign_count` and
    `transports`; a set of recovery codes has `code_hashes` (the ones not used yet). The rest
    keep their defaults.
    """

    factor_id: str  # random, URL-safe; unique over all users
    user: str
    kind: FactorKind
    name: str  # the person's label ("Phone", "YubiKey"), or the kind's own for recovery codes
    created_ts: int  # ms
    last_used_ts: int = 0  # ms; 0: never used
    # TOTP: the secret, sealed with the factor's user and id as associated data.
    sealed_secret: bytes = b""
    # TOTP: the newest time step a code was accepted for (-1: none); a code of that step or
    # an earlier one is a replay.
    last_step: int = -1
    # WebAuthn: the credential's id, its COSE public key, the authenticator's signature
    # counter (0 for authenticators that keep none) and the transports it reported.
    credential_id: bytes = b""
    public_key: bytes = b""
    sign_count: int = 0
    transports: tuple[str, ...] = ()
    # Recovery codes: the digests of those not used yet (hex).
    code_hashes: tuple[str, ...] = ()

    def encode(self) -> str:
        """One JSON text (bytes as base64), for stores that keep a record as one value."""
        record: dict[str, Any] = asdict(self)
        for key in _BYTES_FIELDS:
            record[key] = b64encode(record[key]).decode("ascii")
        record["transports"] = list(self.transports)
        record["code_hashes"] = list(self.code_hashes)
        return json.dumps(record, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | bytes) -> Factor:
        record = json.loads(text)
        for key in _BYTES_FIELDS:
            record[key] = b64decode(record[key])
        record["transports"] = tuple(record["transports"])
        record["code_hashes"] = tuple(record["code_hashes"])
        return cls(**record)


@dataclass(frozen=True, slots=True)
class Challenge:
    """A WebAuthn challenge handed to the browser: single use, short-lived, for one person and
    one purpose. The store finds it by its digest (hex SHA-256 of `challenge`), which is what
    the browser's answer carries back."""

    user: str
    purpose: ChallengePurpose
    challenge: bytes
    expires_ts: int  # ms

    @property
    def key(self) -> str:
        return hashlib.sha256(self.challenge).hexdigest()

    def encode(self) -> str:
        return json.dumps(
            {"user": self.user, "purpose": self.purpose, "challenge": b64encode(self.challenge).decode("ascii"),
             "expires_ts": self.expires_ts},
            separators=(",", ":"),
        )

    @classmethod
    def decode(cls, text: str | bytes) -> Challenge:
        record = json.loads(text)
        return cls(record["user"], record["purpose"], b64decode(record["challenge"]), record["expires_ts"])


class FactorStore(abc.ABC):
    """Second factors and WebAuthn challenges. Every method raises
    `backends.base.StoreUnavailable` when the store cannot answer.

    The writes that decide whether a code or an assertion counts are compare-and-set, atomic
    across every process on the store: of two sign-ins with the same code at once, one wins.
    """

    @abc.abstractmethod
    async def factors(self, user: str) -> list[Factor]:
        """A person's factors, oldest first (recovery codes included, if they have a set)."""

    @abc.abstractmethod
    async def factor(self, user: str, factor_id: str) -> Factor | None:
        """One factor of the person, or None (unknown, or another person's)."""

    @abc.abstractmethod
    async def add_factor(self, factor: Factor) -> bool:
        """Keep a new factor; False, and nothing changed, when its id is taken or, for a
        passkey, the person has that credential id already."""

    @abc.abstractmethod
    async def remove_factor(self, user: str, factor_id: str, *, keep_one: bool = False) -> bool:
        """Forget one factor of the person; False when there was none. With their last app or
        passkey, their recovery codes go in the same step (of a removal and an add at once,
        the person keeps a factor and codes, or has neither). With `keep_one` (a person who
        must have a second factor), also False, and nothing changed, when they have no app or
        passkey but this one: of two removals at once, one can pass."""

    @abc.abstractmethod
    async def remove_all(self, user: str) -> int:
        """Forget every factor of the person (an operator's reset); how many there were."""

    @abc.abstractmethod
    async def set_recovery_codes(self, factor: Factor) -> None:
        """Keep `factor` (kind RECOVERY) as the person's recovery codes, replacing any set
        they had (the old codes stop working at once)."""

    @abc.abstractmethod
    async def add_recovery_codes(self, factor: Factor) -> bool:
        """Keep `factor` (kind RECOVERY) as the person's recovery codes if they have none and
        have an app or passkey; False, and nothing changed, when they have a set (of two first
        factors added at once, the codes of one are kept, and shown) or no factor (removed in
        the meantime: no codes without one)."""

    @abc.abstractmethod
    async def accept_totp_step(self, user: str, factor_id: str, step: int, now_ms: int) -> bool:
        """Record that a code of time step `step` was accepted, if `step` is newer than the
        factor's `last_step` (then also `last_used_ts` = `now_ms`); False, and nothing
        changed, when it is not (a replay) or the factor is gone."""

    @abc.abstractmethod
    async def update_sealed_secret(self, user: str, factor_id: str, sealed_secret: bytes) -> bool:
        """Replace a TOTP factor's sealed secret (sealed again with the current key after a key
        rotation; the secret is the same); False when the factor is gone."""

    @abc.abstractmethod
    async def accept_sign_count(self, user: str, factor_id: str, sign_count: int, now_ms: int) -> bool:
        """Record a passkey's use with the authenticator's counter `sign_count`, if it is above
        the kept one, or both are 0 (an authenticator without a counter); then also
        `last_used_ts`. False, and nothing changed, otherwise (a cloned authenticator's
        replay) or when the factor is gone."""

    @abc.abstractmethod
    async def use_recovery_code(self, user: str, code_hash: str, now_ms: int) -> bool:
        """Take the digest `code_hash` out of the person's recovery codes (and set their
        `last_used_ts`); False when it is not among them (wrong, or used already)."""

    @abc.abstractmethod
    async def add_challenge(self, challenge: Challenge) -> None:
        """Keep a challenge until its `expires_ts`."""

    @abc.abstractmethod
    async def take_challenge(self, key: str) -> Challenge | None:
        """The challenge of that digest, forgotten in the same step (of two takes, one gets
        it); None when unknown, taken already or expired."""
