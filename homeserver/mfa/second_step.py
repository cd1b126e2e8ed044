"""The browser sign-in's second step, once for every page that signs people in (the account
page, the OAuth sign-in, the device approval, MSC3824's single sign-on): the HTTP side is
`PageHandler.form_sign_in` and handlers/second_step_pages.py; this is the rest.

After the password, a person who has or must have a second factor (mfa.policy) gets a
*pending* sign-in, not a browser session: a signed cookie (`PendingSignIn`, short-lived) that
every page but the second step's reads as signed out. The second step's page takes a code, a
recovery code or a passkey (or, for a person who must have a factor and has none, adds one),
then opens the browser session, marked with the factor passed, and sends the person back to
the page they came from (`then`, a path of ours; the cookie keeps only its digest, so no
cookie outgrows a browser's limit and no link can send a person elsewhere). The sign-in is
finished once: its nonce is kept in the factor store as a challenge (purpose `sign_in`), which
the step takes before it checks what was given and gives back when that fails; of two
requests at once (a double click, two tabs), one goes through, the other finds it taken.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit

from backends.base import User
from backends.sessions.factors import SIGN_IN, Challenge
from homeserver.account_page import PATH as ACCOUNT_PATH
from homeserver.account_page import AccountPage, BrowserSessionCookie
from homeserver.mfa.policy import SecondFactorPolicy
from homeserver.mfa.service import SecondFactors

PATH = "/account/second-step"
COOKIE = "hs_pending"
# The page the second step sends the person back to, for one minute: its digest, so that page
# goes on as its own sign-in form would have (PageHandler.back_from_second_step).
BACK_COOKIE = "hs_back"
BACK_LIFETIME = 60
# Seconds between the password and the second step, at most: time to find the phone.
LIFETIME = 600
# The audit trail's reason for the second step's own lines (its checks are audited by the service).
AUDIT_REASON = "second step"


@dataclass(frozen=True, slots=True)
class PendingSignIn:
    """A sign-in whose password passed and whose second step has not: the user, the credential
    fingerprints of the password, when, where the person goes afterwards (a digest of the
    path), which page it began on (its audit reason) and its nonce (base64url; the store keeps
    it until the sign-in is finished)."""

    user: str
    identity_fp: str
    password_fp: str
    issued: int  # seconds since the epoch
    then_digest: str
    reason: str
    nonce: str

    def encode(self) -> str:
        fields = [self.user, self.identity_fp, self.password_fp, self.issued, self.then_digest, self.reason, self.nonce]
        return json.dumps(fields, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> PendingSignIn | None:
        """The pending sign-in of a cookie; None for anything else (a cookie of before nonces too)."""
        try:
            user, identity_fp, password_fp, issued, then_digest, reason, nonce = json.loads(text)
        except (ValueError, TypeError):
            return None
        if not all(isinstance(value, str) for value in (user, identity_fp, password_fp, then_digest, reason, nonce)):
            return None
        if not isinstance(issued, int) or isinstance(issued, bool):
            return None
        return cls(user, identity_fp, password_fp, issued, then_digest, reason, nonce)


def digest(then: str) -> str:
    return hashlib.sha256(then.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def ours(then: str) -> bool:
    """Whether `then` is a path of this server's pages (under /account/), and nothing else."""
    if not then.startswith(ACCOUNT_PATH) or "\\" in then or any(c.isspace() or ord(c) < 32 for c in then):
        return False
    parts = urlsplit(then)
    return not parts.scheme and not parts.netloc and parts.path.startswith(ACCOUNT_PATH)


def url(then: str) -> str:
    """The second step's page, for a person who goes on to `then`."""
    return PATH + "?" + urlencode({"then": then})


class SecondStep:
    """Pending sign-ins: begun after the password, read back, finished into browser sessions."""

    def __init__(
        self,
        factors: SecondFactors,
        policy: SecondFactorPolicy,
        account_page: AccountPage,
        *,
        lifetime: int = LIFETIME,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.factors = factors
        self.policy = policy
        self.account_page = account_page
        self.lifetime = lifetime
        self.clock = clock

    async def needed(self, user: User) -> bool:
        return await self.policy.needed(user)

    async def must_add(self, user: User) -> bool:
        """Whether the second step adds a factor (the person must have one and has none)."""
        return self.policy.must_have(user) and not await self.factors.has_factor(user.name)

    async def begin(self, user: User, then: str, reason: str) -> PendingSignIn:
        """The pending sign-in of a person whose password just passed, going on to `then`; its
        nonce kept in the store until it is finished or its lifetime is over."""
        fingerprint = self.account_page.credentials.of(user)
        target = then if ours(then) else ACCOUNT_PATH
        issued = int(self.clock())
        nonce = secrets.token_bytes(32)
        await self.factors.store.add_challenge(Challenge(user.name, SIGN_IN, nonce, (issued + self.lifetime) * 1000))
        return PendingSignIn(
            user.name, fingerprint.identity, fingerprint.password, issued, digest(target), reason,
            base64.urlsafe_b64encode(nonce).decode("ascii").rstrip("="),
        )

    async def take(self, pending: PendingSignIn) -> Challenge | None:
        """The pending sign-in taken, in one store step, for one request to finish: of two at
        once, one gets it. None when it is taken (finished, or being finished), or gone."""
        try:
            nonce = base64.urlsafe_b64decode(pending.nonce + "=" * (-len(pending.nonce) % 4))
        except (binascii.Error, ValueError):
            return None
        taken = await self.factors.store.take_challenge(hashlib.sha256(nonce).hexdigest())
        if taken is None or taken.user != pending.user or taken.purpose != SIGN_IN:
            return None
        return taken

    async def give_back(self, taken: Challenge) -> None:
        """A taken sign-in not finished (what was given did not pass): pending again."""
        await self.factors.store.add_challenge(taken)

    async def standing(self, pending: PendingSignIn | None) -> User | None:
        """The user of a pending sign-in that still stands (in time, the user there, unlocked,
        the same password), else None."""
        if pending is None:
            return None
        user, _ = await self.account_page.standing(
            pending.user, pending.identity_fp, pending.password_fp, pending.issued, self.lifetime
        )
        return user

    @staticmethod
    def then(pending: PendingSignIn, then: str) -> str:
        """Where the person goes once through: `then` when it is the path the sign-in began
        with, else the account page."""
        return then if ours(then) and digest(then) == pending.then_digest else ACCOUNT_PATH

    async def finish(self, user: User, kind: str, ip: str, user_agent: str) -> BrowserSessionCookie:
        """The browser session of a person through the second step with `kind` (its cookie)."""
        return await self.account_page.open(user, ip, user_agent, second_factor=kind)
