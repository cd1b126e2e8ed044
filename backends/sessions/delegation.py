"""Delegation state: what Synapse was told, kept beside the sessions (homeserver.delegation)."""

from __future__ import annotations

import abc


class DelegationState(abc.ABC):
    """What this server, as Synapse's authentication service, remembers of its calls to
    Synapse: the profile last provisioned per user (so an unchanged one is not sent again)
    and the users whose devices Synapse must be told again because a call failed (retried
    by every server on the store until Synapse answers). Every method raises
    `backends.base.StoreUnavailable` when the store cannot answer.

    Used by homeserver.delegation and the `delegation sync` / `sessions revoke` commands.
    """

    @abc.abstractmethod
    async def provisioned(self, user: str) -> str | None:
        """The digest of the profile last provisioned at Synapse for the user; None if never."""

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
