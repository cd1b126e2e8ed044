"""What the move of a Synapse here keeps beside the sessions (homeserver.migration, issue 35): the
tokens it carried and the users Synapse had deactivated. A part of the session store, reached by
its door `SessionStore.imported()`, implemented on the same SQLite file or Redis (sqlite/imported.py,
redis/imported.py).

The sessions and grants the move makes are the store's own records (a `Session` per live access
token, a `Grant` per live refresh token); this part writes them in bulk, with its bookkeeping,
so that a batch of users is either all there or not there at all (SQLite: one transaction;
Redis: one MULTI/EXEC, or, on a Cluster, its bookkeeping last).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

from backends.sessions.oauth import Grant
from backends.sessions.records import Session


@dataclass(frozen=True, slots=True)
class ImportBatch:
    """What one batch of a move writes to the session store.

    `sessions`: each with its device's display name (a device already here keeps its name);
    `grants`: each with how long it is kept without a refresh (seconds); `tokens`: the digest
    and user of every token carried (access and refresh), the move's bookkeeping, written last;
    `deactivated`: users deactivated at Synapse.
    """

    sessions: list[tuple[Session, str | None]] = field(default_factory=list)
    grants: list[tuple[Grant, float]] = field(default_factory=list)
    tokens: list[tuple[str, str]] = field(default_factory=list)
    deactivated: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.sessions or self.grants or self.tokens or self.deactivated)


class ImportedState(abc.ABC):
    """The move's bookkeeping and its bulk writes. Every method raises
    `backends.base.StoreUnavailable` when the store cannot answer.

    Read by the auth step (`token_user`: the user of a carried token that does not name its
    user, such as Synapse's old macaroons), the logins (`is_deactivated`), the directory sweep
    (`deactivated_users`: never provision or reactivate them) and the move itself
    (`known_tokens`, so that a second run adds nothing twice).
    """

    @abc.abstractmethod
    async def add(self, batch: ImportBatch) -> None:
        """Write the batch: sessions (and their devices) and grants that are not there yet,
        then the bookkeeping; all of it or none of it (a Cluster: the bookkeeping last, so a
        batch cut short is written again, whole, by the next run)."""

    @abc.abstractmethod
    async def undo(self, batch: ImportBatch) -> None:
        """Take back what `add` wrote of a batch whose users could not then be written to the user
        store (its sessions, their devices left with none, its grants, its bookkeeping; users
        marked deactivated stay so)."""

    @abc.abstractmethod
    async def known_tokens(self, digests: list[str]) -> set[str]:
        """Which of these token digests a move carried already."""

    @abc.abstractmethod
    async def token_user(self, token_hash: str) -> str | None:
        """The user of a token a move carried, by its digest alone; None for any other."""

    @abc.abstractmethod
    async def is_deactivated(self, user: str) -> bool:
        """Whether Synapse had deactivated the user when it moved here (refused here for good)."""

    @abc.abstractmethod
    async def deactivated_users(self) -> set[str]:
        """Every user Synapse had deactivated when it moved here."""
