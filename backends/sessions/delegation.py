"""Delegation state: what Synapse was told, kept beside the sessions (homeserver.delegation),
and the directory sweep's own (homeserver.delegation.sweep)."""

from __future__ import annotations

import abc
from collections.abc import Collection

# The digest kept for a user the directory sweep deactivated at Synapse (they left the user
# store): whoever provisions them next (the sweep, a login) reactivates them first.
DEACTIVATED = "deactivated"
# The digest kept while the sweep asks Synapse to deactivate a user: until Synapse answers, the
# outcome is unknown (an answer lost to a timeout, the process stopped), so the next sweep asks
# again if they are still missing, and whoever provisions them reactivates them first.
DEACTIVATING = "deactivating"


class DelegationState(abc.ABC):
    """What this server, as Synapse's authentication service, remembers of its calls to
    Synapse: the profile last provisioned per user (so an unchanged one is not sent again)
    and the users whose devices Synapse must be told again because a call failed (retried
    by every server on the store until Synapse answers). Every method raises
    `backends.base.StoreUnavailable` when the store cannot answer.

    The directory sweep keeps its own here too: the users provisioned at Synapse who are
    missing from the user store and since when (deactivated after `deactivate_after`), the
    sweep's lease (one process of all those on the store sweeps, once per interval) and the
    number of users the last sweep found (the guard's reference).

    Used by homeserver.delegation and the `delegation sync` / `sessions revoke` commands.
    """

    @abc.abstractmethod
    async def provisioned(self, user: str) -> str | None:
        """The digest of the profile last provisioned at Synapse for the user (DEACTIVATED
        once the sweep deactivated them, DEACTIVATING while it asks); None if never."""

    @abc.abstractmethod
    async def set_provisioned(self, user: str, digest: str) -> None:
        """Remember the digest of the profile just provisioned at Synapse."""

    @abc.abstractmethod
    async def mark_resync(self, user: str, mark: int) -> None:
        """Remember, durably, that Synapse must be told the user's devices again (a call failed)."""

    @abc.abstractmethod
    async def resyncs(self) -> dict[str, int]:
        """The users Synapse must be told about again, each with its latest mark."""

    @abc.abstractmethod
    async def clear_resync(self, user: str, mark: int) -> bool:
        """Forget the user's resync if its mark is still `mark` (not marked again since); True if forgotten."""

    # -- the directory sweep --------------------------------------------------------------

    @abc.abstractmethod
    async def provisioned_all(self) -> dict[str, str]:
        """Every user ever provisioned at Synapse, with the digest last told (`provisioned`), at once."""

    @abc.abstractmethod
    async def missing(self) -> dict[str, int]:
        """The users provisioned at Synapse whom a sweep found missing from the user store,
        each with when one first missed them (ms since the epoch)."""

    @abc.abstractmethod
    async def set_missing(self, since: dict[str, int]) -> None:
        """Remember users as missing since then; one already missing keeps its earlier time."""

    @abc.abstractmethod
    async def clear_missing(self, users: Collection[str]) -> None:
        """Forget that these users are missing (they came back, or were deactivated)."""

    @abc.abstractmethod
    async def claim_sweep(self, holder: str, ttl_ms: int, interval_ms: int | None) -> bool:
        """Take the sweep's lease for `ttl_ms` (by the store's clock) and record that a sweep
        starts now; refused (False) while another holder's lease runs, or, with
        `interval_ms`, when a sweep started less than that long ago (not due yet). None:
        due whenever the lease is free (a sweep on demand)."""

    @abc.abstractmethod
    async def renew_sweep(self, holder: str, ttl_ms: int) -> bool:
        """Keep the lease `ttl_ms` longer; False when `holder` no longer holds it."""

    @abc.abstractmethod
    async def release_sweep(self, holder: str) -> None:
        """Give the lease back if `holder` holds it (when the last sweep started stays)."""

    @abc.abstractmethod
    async def sweep_reference(self) -> int | None:
        """How many users the last sweep the guard let through found; None before any."""

    @abc.abstractmethod
    async def set_sweep_reference(self, count: int) -> None:
        """Remember how many users this sweep found (one the guard let through)."""
