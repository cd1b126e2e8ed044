"""Who must pass a second step: a person who has a second factor (an app or a passkey), or who
must have one (`[mfa] required = "all"`, or the user store's mark: a users-file record's or
Redis hash's `mfa_required`, LDAP's `mfa_required_filter`). Asked by the browser sign-in (the
second step), by the password login (refused for them) and by device deletion's UIA."""

from __future__ import annotations

from backends.base import User
from homeserver.mfa.service import SecondFactors


class SecondFactorPolicy:
    """`needed(user)`: whether the person must pass a second step to sign in."""

    def __init__(self, factors: SecondFactors, *, required_for_all: bool) -> None:
        self.factors = factors
        self.required_for_all = required_for_all

    def must_have(self, user: User) -> bool:
        """Whether the person must have a second factor, by the config or the user store."""
        return self.required_for_all or user.mfa_required

    async def needed(self, user: User) -> bool:
        """Whether a sign-in of the person needs a second step (passing one, or adding one)."""
        return self.must_have(user) or await self.factors.has_factor(user.name)
