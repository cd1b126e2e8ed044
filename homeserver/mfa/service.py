"""Second factors, the service the account page and the sign-in's second step call: adding
and removing authenticator apps and passkeys, recovery codes, and the checks of a code or a
passkey, over the store's FactorStore, the operator's keyring and the wrong-code limit.

Nothing here knows HTTP: a refusal is an exception (WrongCode, TooManyWrongCodes,
PasskeyError, EnrolmentExpired), each safe to log, none holding what was typed.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from backends.sessions.buckets import RateBuckets
from backends.sessions.factors import RECOVERY, TOTP, WEBAUTHN, Factor, FactorKind, FactorStore
from homeserver.audit import audit
from homeserver.config import Config
from homeserver.mfa import passkeys, qr, recovery, totp
from homeserver.mfa.limits import TooManyWrongCodes, WrongCodeLimit
from homeserver.mfa.passkeys import PasskeyError, PasskeysUnavailable, RelyingParty
from homeserver.mfa.sealing import Keyring, SealError, associated_data, keyring

logger = logging.getLogger(__name__)

# Audit events (homeserver.audit): a second step passed or failed, a factor added or removed,
# all of a person's factors removed by an operator.
SECOND_FACTOR = "second_factor"
FACTOR_ADDED = "factor_added"
FACTOR_REMOVED = "factor_removed"
FACTORS_RESET = "factors_reset"

# How long the page adding an authenticator app may wait for its first code.
ENROLMENT_LIFETIME_MS = 900_000
MAX_NAME = 64
QR_TITLE = "QR code of the authenticator app link"
DEFAULT_NAMES = {TOTP: "Authenticator app", WEBAUTHN: "Passkey", RECOVERY: "Recovery codes"}
_PENDING = "totp-pending"

Observer = Callable[[FactorKind, bool], None]


class WrongCode(Exception):
    """The code is not a current code of the person's apps nor one of their recovery codes,
    or it was accepted before (a replay)."""


class LastFactor(Exception):
    """The person must have a second factor, and this is their last app or passkey."""


class EnrolmentExpired(Exception):
    """The form adding an authenticator app is too old, or not this person's: start again."""


@dataclass(frozen=True, slots=True)
class TotpEnrolment:
    """What the page adding an authenticator app shows: the QR code (inline SVG) of `uri`, the
    `otpauth://` link itself, the secret as text (to type it in), and `pending`, an opaque
    sealed text for a hidden form field that `finish_totp` takes back with the first code."""

    secret: str
    uri: str
    qr_svg: str
    pending: str


@dataclass(frozen=True, slots=True)
class Added:
    """A new factor, and the recovery codes to show once (empty unless it was the first)."""

    factor: Factor
    recovery_codes: list[str]


@dataclass(frozen=True, slots=True)
class Passed:
    """A second step passed: with which factor, and how many recovery codes are left (for
    the page to say so after one was used)."""

    factor_id: str
    kind: FactorKind
    recovery_left: int | None = None


def _now_ms(clock: Callable[[], float]) -> int:
    return int(clock() * 1000)


def _name(name: str, kind: FactorKind) -> str:
    clean = " ".join("".join(c for c in name if c.isprintable()).split())[:MAX_NAME]
    return clean or DEFAULT_NAMES[kind]


def _new_id() -> str:
    return secrets.token_urlsafe(16)


def issuer_of(config: Config) -> str:
    """The name authenticator apps show: `[mfa] issuer`, else the server name without its port."""
    configured: str = config.get("mfa", "issuer")
    if configured:
        return configured
    name: str = config.get("server", "server_name")
    return name[:name.index("]") + 1] if name.startswith("[") else name.split(":", 1)[0]


class SecondFactors:
    """One person's second factors, for every page that asks or manages them."""

    def __init__(
        self,
        store: FactorStore,
        keys: Keyring,
        limit: WrongCodeLimit,
        *,
        issuer: str,
        relying_party: RelyingParty | None,
        clock: Callable[[], float] = time.time,
        observer: Observer | None = None,
    ) -> None:
        self.store = store
        self.keys = keys
        self.limit = limit
        self.issuer = issuer
        self.relying_party = relying_party  # None: passkeys unavailable (an IP base URL)
        self.clock = clock
        self.observer = observer  # metrics: (kind, passed) per second-step check

    @classmethod
    def from_config(
        cls, config: Config, store: FactorStore, buckets: RateBuckets | None, observer: Observer | None = None
    ) -> SecondFactors:
        """The service of `[mfa]`: its key (made on first start), the wrong-code limit in the
        session store's `buckets` (None: counted in each process), passkeys for `[server]
        base_url` (off, with a warning, when its host is an IP address)."""
        name = issuer_of(config)
        return cls(
            store, keyring(config), WrongCodeLimit.from_config(config.section("mfa"), buckets),
            issuer=name, relying_party=cls.relying_party_of(config.get("server", "base_url"), name),
            observer=observer,
        )

    @staticmethod
    def relying_party_of(base_url: str, name: str) -> RelyingParty | None:
        """The relying party of the base URL, or None (logged) when it cannot be one."""
        try:
            return RelyingParty.from_base_url(base_url, name)
        except PasskeysUnavailable as exc:
            logger.warning("passkeys are off: %s", exc)
            return None

    # -- what a person has ------------------------------------------------------------------

    async def factors(self, user: str) -> list[Factor]:
        """Every factor of the person (recovery codes included), oldest first."""
        return await self.store.factors(user)

    async def has_factor(self, user: str) -> bool:
        """Whether the sign-in must ask for a second step: an app or a passkey (recovery codes
        alone are no factor; they go when the last one does)."""
        return any(f.kind != RECOVERY for f in await self.store.factors(user))

    # -- adding an authenticator app ----------------------------------------------------------

    async def begin_totp(self, user: str, account: str | None = None) -> TotpEnrolment:
        """A new secret for the person's app, nothing kept yet. `account` is the name the app
        shows (default: the user name)."""
        secret = totp.new_secret()
        uri = totp.provisioning_uri(secret, account or user, self.issuer)
        record = {"f": _new_id(), "s": secret, "e": _now_ms(self.clock) + ENROLMENT_LIFETIME_MS}
        sealed = self.keys.seal(json.dumps(record).encode(), associated_data(_PENDING, user, ""))
        pending = base64.urlsafe_b64encode(sealed).decode("ascii").rstrip("=")
        return await self._enrolment(secret, uri, pending)

    @staticmethod
    async def _enrolment(secret: str, uri: str, pending: str) -> TotpEnrolment:
        """The page's values, the QR code drawn on the loop's default pool: segno's choice of a
        mask is some milliseconds of CPU, all of which every other request waited for on the
        loop. (It is Python holding the GIL: on a thread the loop still waits for it, up to the
        interpreter's switch interval, 5 ms, each time it wakes during a drawing.)"""
        drawing = await asyncio.get_running_loop().run_in_executor(None, qr.svg, uri, QR_TITLE)
        return TotpEnrolment(secret, uri, drawing, pending)

    def _pending(self, user: str, pending: str) -> tuple[str, str]:
        """The factor id and secret of a `begin_totp` still in time; EnrolmentExpired otherwise."""
        try:
            raw = base64.urlsafe_b64decode(pending + "=" * (-len(pending) % 4))
            record = json.loads(self.keys.open(raw, associated_data(_PENDING, user, "")))
            factor_id, secret, expires = str(record["f"]), str(record["s"]), int(record["e"])
        except (binascii.Error, ValueError, SealError, KeyError, TypeError):
            raise EnrolmentExpired("not a pending authenticator app of this person") from None
        if expires <= _now_ms(self.clock):
            raise EnrolmentExpired("the authenticator app was not confirmed in time")
        return factor_id, secret

    async def reopen_totp(self, user: str, pending: str, account: str | None = None) -> TotpEnrolment:
        """The page of a `begin_totp` shown again (a wrong first code): the same secret, the
        person's app scanned already. EnrolmentExpired when it is too old or not theirs."""
        _, secret = self._pending(user, pending)
        return await self._enrolment(secret, totp.provisioning_uri(secret, account or user, self.issuer), pending)

    async def finish_totp(self, user: str, pending: str, code: str, name: str = "") -> Added:
        """Keep the app of `begin_totp` once the person typed a current code of it (that code
        is then used: it cannot pass a sign-in). WrongCode when it is not; EnrolmentExpired
        when `pending` is too old or not theirs. Submitting the same form twice adds it once."""
        factor_id, secret = self._pending(user, pending)
        now = _now_ms(self.clock)
        step = totp.matching_step(secret, code, now / 1000)
        if step is None:
            raise WrongCode("not a current code of the new app")
        factor = Factor(
            factor_id=factor_id, user=user, kind=TOTP, name=_name(name, TOTP), created_ts=now,
            sealed_secret=self.keys.seal(secret.encode("ascii"), associated_data(TOTP, user, factor_id)),
            last_step=step,
        )
        return await self._added(factor)

    async def _added(self, factor: Factor) -> Added:
        """Keep the new factor, and with the person's first one their recovery codes: added only
        if they have no set, in one store step, so of first factors added at once (two tabs),
        one brings the codes and shows them, and no later set replaces the one shown."""
        if not await self.store.add_factor(factor):
            existing = await self.store.factor(factor.user, factor.factor_id)
            if existing is not None and existing.kind == factor.kind:
                return Added(existing, [])  # the same form sent twice (at once, too: read after)
            raise PasskeyError("this passkey is added already")
        audit(FACTOR_ADDED, user=factor.user, reason=factor.kind)
        codes = recovery.new_codes()
        if not await self.store.add_recovery_codes(self._recovery_codes(factor.user, codes)):
            codes = []  # they have a set: it stays (or the factor was removed meanwhile: none)
        return Added(factor, codes)

    # -- adding a passkey ---------------------------------------------------------------------

    def _rp(self) -> RelyingParty:
        if self.relying_party is None:
            raise PasskeyError("passkeys are off: the server's base URL has no host name")
        return self.relying_party

    def user_handle(self, user: str) -> bytes:
        """The WebAuthn user id of a person: opaque (a keyed digest, not their name), 16 bytes."""
        return bytes.fromhex(self.keys.digest(b"webauthn user handle\0" + user.encode("utf-8", "surrogatepass")))[:16]

    async def begin_passkey(self, user: str, display_name: str = "") -> str:
        """The JSON options of `navigator.credentials.create()` (for the page's data attribute);
        the challenge is kept in the store."""
        options, challenge = passkeys.registration_options(
            self._rp(), user, display_name, self.user_handle(user), await self.store.factors(user),
            _now_ms(self.clock),
        )
        await self.store.add_challenge(challenge)
        return options

    async def finish_passkey(self, user: str, answer: str, name: str = "") -> Added:
        """Keep the passkey the browser made (its PublicKeyCredential as JSON). PasskeyError
        when the answer does not pass or its challenge is unknown, used or expired."""
        rp = self._rp()
        challenge = await self.store.take_challenge(passkeys.challenge_key(answer))
        if challenge is None:
            raise PasskeyError("unknown, used or expired challenge")
        new = passkeys.verify_registration(rp, challenge, user, answer, _now_ms(self.clock))
        now = _now_ms(self.clock)
        factor = Factor(
            factor_id=_new_id(), user=user, kind=WEBAUTHN, name=_name(name, WEBAUTHN), created_ts=now,
            credential_id=new.credential_id, public_key=new.public_key, sign_count=new.sign_count,
            transports=new.transports,
        )
        return await self._added(factor)

    # -- managing -------------------------------------------------------------------------------

    async def remove(self, user: str, factor_id: str, *, keep_one: bool = False) -> bool:
        """Remove one of the person's apps or passkeys; with the last of them, the recovery codes
        go too, in the same store step (an app added meanwhile gets codes of its own, not none).
        False when they have no such factor. `keep_one`: the person must have a second factor
        (mfa.policy), and LastFactor is raised for their last app or passkey, decided in the
        store's one step, so of two removals at once, one passes."""
        if not await self.store.remove_factor(user, factor_id, keep_one=keep_one):
            if keep_one and await self.store.factor(user, factor_id) is not None:
                raise LastFactor(f"{user}'s last second factor")
            return False
        audit(FACTOR_REMOVED, user=user)
        return True

    def _recovery_codes(self, user: str, codes: list[str]) -> Factor:
        return Factor(
            factor_id=_new_id(), user=user, kind=RECOVERY, name=DEFAULT_NAMES[RECOVERY],
            created_ts=_now_ms(self.clock), code_hashes=tuple(recovery.digest(self.keys, user, code) for code in codes),
        )

    async def renew_recovery_codes(self, user: str) -> list[str]:
        """New recovery codes for the person (to show once); the old ones stop working."""
        codes = recovery.new_codes()
        await self.store.set_recovery_codes(self._recovery_codes(user, codes))
        return codes

    async def reset(self, user: str) -> int:
        """Remove every factor of the person (`mfa reset`, audited); how many there were."""
        count = await self.store.remove_all(user)
        audit(FACTORS_RESET, user=user, count=count)
        return count

    # -- the sign-in's second step --------------------------------------------------------------

    async def check_code(self, user: str, code: str) -> Passed:
        """Pass the second step with a current code of one of the person's apps, or one of their
        recovery codes (each once). TooManyWrongCodes when their wrong codes are over the
        limit (then even a right code is refused); WrongCode otherwise."""
        async with self.limit.one_at_a_time(user):  # counted before the next is looked at
            return await self._check_code(user, code)

    async def _check_code(self, user: str, code: str) -> Passed:
        try:
            await self.limit.check(user)
        except TooManyWrongCodes:
            audit(SECOND_FACTOR, user=user, outcome="failure", reason="too many wrong codes", level=logging.WARNING)
            raise
        now = _now_ms(self.clock)
        passed: Passed | None = None
        replay = False
        kind: FactorKind = TOTP if totp.normalize_code(code) is not None else RECOVERY
        if kind == TOTP:
            for factor in await self.store.factors(user):
                if factor.kind == TOTP:
                    outcome = await self._totp(factor, code, now)
                    replay = replay or outcome is False
                    if outcome:
                        passed = Passed(factor.factor_id, TOTP)
                        break
        else:
            for digest in recovery.candidate_digests(self.keys, user, code):
                if await self.store.use_recovery_code(user, digest, now):
                    left = next((f for f in await self.store.factors(user) if f.kind == RECOVERY), None)
                    passed = Passed(left.factor_id if left else "", RECOVERY, len(left.code_hashes) if left else 0)
                    break
        if self.observer is not None:
            self.observer(kind, passed is not None)
        if passed is None:
            await self.limit.failed(user)
            reason = "code used before" if replay else "wrong code"
            audit(SECOND_FACTOR, user=user, outcome="failure", reason=reason, level=logging.WARNING)
            raise WrongCode(reason)
        audit(SECOND_FACTOR, user=user, outcome="success", reason=passed.kind)
        return passed

    async def _totp(self, factor: Factor, code: str, now: int) -> bool | None:
        """True: accepted (its step recorded); False: a replay; None: not this app's code."""
        where = associated_data(TOTP, factor.user, factor.factor_id)
        try:
            secret = self.keys.open(factor.sealed_secret, where).decode("ascii")
        except SealError as exc:
            logger.error("second factor %s of %s cannot be opened (%s): was [mfa] key changed without "
                         "listing the old one in previous_keys?", factor.factor_id, factor.user, exc)
            return None
        step = totp.matching_step(secret, code, now / 1000)
        if step is None:
            return None
        if step <= factor.last_step or not await self.store.accept_totp_step(factor.user, factor.factor_id, step, now):
            return False
        if not self.keys.is_current(factor.sealed_secret):  # sealed before a key rotation
            await self.store.update_sealed_secret(factor.user, factor.factor_id, self.keys.seal(secret.encode(), where))
        return True

    async def begin_passkey_check(self, user: str) -> str | None:
        """The JSON options of `navigator.credentials.get()` for the person's passkeys (the
        challenge kept in the store); None when they have none or passkeys are off."""
        factors = [f for f in await self.store.factors(user) if f.kind == WEBAUTHN]
        if not factors or self.relying_party is None:
            return None
        options, challenge = passkeys.authentication_options(self.relying_party, user, factors, _now_ms(self.clock))
        await self.store.add_challenge(challenge)
        return options

    async def finish_passkey_check(self, user: str, answer: str) -> Passed:
        """Pass the second step with the browser's answer to `begin_passkey_check`'s options.
        PasskeyError when it does not pass (wrong origin or RP ID, another person's or a removed
        passkey, a used or expired challenge, a counter that did not grow)."""
        try:
            rp = self._rp()
            challenge = await self.store.take_challenge(passkeys.challenge_key(answer))
            if challenge is None:
                raise PasskeyError("unknown, used or expired challenge")
            now = _now_ms(self.clock)
            use = passkeys.verify_authentication(rp, challenge, user, answer, await self.store.factors(user), now)
            if not await self.store.accept_sign_count(user, use.factor.factor_id, use.sign_count, now):
                raise PasskeyError("assertion refused: the counter did not grow (a second use at once?)")
        except PasskeyError as exc:
            if self.observer is not None:
                self.observer(WEBAUTHN, False)
            audit(SECOND_FACTOR, user=user, outcome="failure", reason=str(exc), level=logging.WARNING)
            raise
        if self.observer is not None:
            self.observer(WEBAUTHN, True)
        audit(SECOND_FACTOR, user=user, outcome="success", reason=WEBAUTHN)
        return Passed(use.factor.factor_id, WEBAUTHN)


__all__ = [
    "Added",
    "EnrolmentExpired",
    "LastFactor",
    "Passed",
    "PasskeyError",
    "SecondFactors",
    "TooManyWrongCodes",
    "TotpEnrolment",
    "WrongCode",
]
