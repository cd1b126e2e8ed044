"""The service's one door to the user store: the name guard, then the configured backend."""

from __future__ import annotations

from backends.base import User, UserBackend, canonical_email
from homeserver.names import possible_name


class Users:
    """Look users up in the backend, never passing it a name no account can have."""

    def __init__(self, backend: UserBackend) -> None:
        self.backend = backend

    async def get(self, name: str, *, case_insensitive: bool = False) -> User | None:
        """Return the user named `name` (exactly, or by the backend's case-insensitive rule)."""
        if not possible_name(name):
            return None
        return await self.backend.get_user(name, case_insensitive=case_insensitive)

    async def by_email(self, address: str) -> list[User]:
        """Every user holding the address (matched without regard to case); [] for text no
        address can be, without asking the store."""
        canonical = canonical_email(address) if possible_name(address) else None
        if canonical is None:
            return []
        return await self.backend.get_users_by_email(canonical)

    async def verify_password(self, user: User, password: str) -> bool | None:
        """Let a backend that checks passwords itself (LDAP bind) answer; None otherwise."""
        return await self.backend.verify_password(user, password)
