"""The service's one door to the user store: the name guard, the backend's metrics, then the backend."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable
from typing import TYPE_CHECKING, TypeVar

from backends.base import User, UserBackend, canonical_email
from homeserver.names import possible_name

if TYPE_CHECKING:
    from homeserver.metrics import Metrics

T = TypeVar("T")

logger = logging.getLogger(__name__)

# Reported unusable passwords remembered at most; past this the memory starts afresh.
MAX_REPORTED = 10_000


class Users:
    """Look users up in the backend, never passing it a name no account can have.

    Every call the service makes to the backend passes here, so with metrics on each is
    timed and its failures counted by operation, whatever the backend offers: there is no
    second implementation of the backend interface to fall behind it.
    """

    def __init__(self, backend: UserBackend, metrics: Metrics | None = None) -> None:
        self.backend = backend
        self.metrics = metrics
        self._reported: set[tuple[str, str | None]] = set()

    def _call(self, operation: str, call: Awaitable[T]) -> Awaitable[T]:
        """The backend's call, timed when metrics are on (with them off, no coroutine of our own)."""
        if self.metrics is None:
            return call
        return self._timed(operation, call)

    async def _timed(self, operation: str, call: Awaitable[T]) -> T:
        assert self.metrics is not None
        started, failed = time.perf_counter(), True
        try:
            result = await call
            failed = False
            return result
        finally:
            self.metrics.observe_backend(self.backend.name, operation, time.perf_counter() - started, failed)

    async def get(self, name: str, *, case_insensitive: bool = False) -> User | None:
        """Return the user named `name` (exactly, or by the backend's case-insensitive rule)."""
        if not possible_name(name):
            return None
        return await self._call("get_user", self.backend.get_user(name, case_insensitive=case_insensitive))

    async def list_all(self) -> list[User]:
        """Every user of the store, read without holding the loop (the directory sweep);
        StoreIncomplete when the store could not be read whole (UserBackend.list_users)."""
        return await self._call("list_users", self.backend.list_users())

    async def by_email(self, address: str) -> list[User]:
        """Every user holding the address (matched without regard to case); [] for text no
        address can be, without asking the store."""
        canonical = canonical_email(address) if possible_name(address) else None
        if canonical is None:
            return []
        return await self._call("get_users_by_email", self.backend.get_users_by_email(canonical))

    async def verify_password(self, user: User, password: str) -> bool | None:
        """Let a backend that checks passwords itself (LDAP bind) answer; None otherwise."""
        return await self._call("verify_password", self.backend.verify_password(user, password))

    async def waste_password_check(self, password: str) -> bool:
        """The store's own work for a wrong password, for a name it lacks; False when the
        store leaves passwords to the stored hash (UserBackend.waste_password_check)."""
        return await self._call("waste_password_check", self.backend.waste_password_check(password))

    def changed_accounts(self) -> AsyncIterator[dict[str, list[str]]]:
        """The accounts the backend says changed ({name: the fields}), as it learns of them."""
        return self.backend.changed_accounts()

    async def check_health(self) -> None:
        """Raise StoreUnavailable when the user store cannot answer (readiness)."""
        await self._call("check_health", self.backend.check_health())

    def report_unusable_password(self, user: User, why: str) -> None:
        """Log an operator error for a stored password that cannot be used, once per user and value.

        Not once per login: a client retrying would fill the log. A changed stored value is
        reported again.
        """
        key = (user.name, user.password)
        if key in self._reported:
            return
        if len(self._reported) >= MAX_REPORTED:
            self._reported.clear()
        self._reported.add(key)
        logger.error(
            "operator error: stored password of user %r cannot be used (its logins answer 500): %s", user.name, why
        )
