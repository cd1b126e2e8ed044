"""`migrate-synapse run`: a Synapse's users, devices and tokens into this server's stores, batch by batch.

One pass over `SynapseDatabase.accounts()`. Each batch of users is looked up in the user store,
planned (homeserver/migration/plan.py), stripped of what an earlier run carried (the move's
bookkeeping, `ImportedState.known_tokens`), then written in this order:

1. the session store: the batch's sessions, devices, grants, deactivated users and bookkeeping,
   all or nothing (`ImportedState.add`);
2. the user store: the new records of a users file or Redis store, all or nothing
   (`UserBackend.add_users`); should that fail, step 1 is taken back (`ImportedState.undo`).

So a user is either fully there or absent: a failure in 1 leaves nothing of the batch; a
failure in 2 takes 1 back; a crash between them leaves sessions whose user has no record
(no token of theirs is taken), and the next run, finding their tokens carried, adds the
records. A second run adds nothing twice. `dry_run` plans and counts, and writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

from backends.base import User, UserBackend, canonical_email
from backends.sessions.imported import ImportBatch, ImportedState
from backends.synapse.database import SynapseDatabase
from backends.synapse.rows import SynapseAccount
from homeserver.credentials import Credentials
from homeserver.migration.plan import (
    ACCESS,
    ADDED,
    DEACTIVATED,
    DEVICE,
    DIRECTORY,
    KEPT,
    REFRESH,
    Planner,
    UserPlan,
    new_record,
    place,
)
from homeserver.migration.survey import LOOKUPS, Names
from homeserver.oauth.common import grant_session_digest
from homeserver.users import Users

BATCH = 1000  # users per batch: about 5,000 sessions, one transaction


@dataclass
class ImportCounts:
    """What a run did (or, dry, would do)."""

    users: int = 0  # Synapse users read
    added: int = 0  # new records in the user store
    kept: int = 0  # already in the user store: its record kept
    directory: int = 0  # found in the LDAP directory
    deactivated: int = 0  # deactivated at Synapse: recorded, refused here
    not_moved: Names = field(default_factory=Names)
    devices: int = 0  # devices of the users moved
    device_only: int = 0  # devices newly kept with no live token
    access: int = 0  # access tokens newly carried as sessions
    refresh: int = 0  # refresh tokens newly carried (current and previous of each grant)
    dropped_refresh: int = 0  # older refresh chains of a device that has a newer one
    already: int = 0  # tokens (and devices without one) an earlier run carried
    emails_taken: Names = field(default_factory=Names)  # addresses another user here holds: left out
    locked_elsewhere: Names = field(default_factory=Names)  # locked at Synapse, not locked in the store
    admins_elsewhere: Names = field(default_factory=Names)  # Synapse admins the store does not mark

    @property
    def moved(self) -> int:
        return self.added + self.kept + self.directory


class Importer:
    """Moves accounts into the user `backend` (through `users`) and the session store's `imported`
    part. `directory`: the user store is LDAP (no records are written, none needed);
    `admins`: `[delegation] admins`. `progress(done, total)` is told after each batch."""

    def __init__(
        self,
        *,
        users: Users,
        backend: UserBackend,
        imported: ImportedState,
        credentials: Credentials,
        directory: bool,
        admins: frozenset[str] = frozenset(),
        dry_run: bool = False,
        batch_size: int = BATCH,
        now_ms: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.users = users
        self.backend = backend
        self.imported = imported
        self.credentials = credentials
        self.directory = directory
        self.admins = admins
        self.dry_run = dry_run
        self.batch_size = batch_size
        self.planner = Planner(now_ms=now_ms)
        self.progress = progress
        self.counts = ImportCounts()
        self._total = 0

    async def run(self, database: SynapseDatabase, server_name: str) -> ImportCounts:
        self._total = database.count("users")
        batch: list[SynapseAccount] = []
        for account in database.accounts(server_name):
            batch.append(account)
            if len(batch) >= self.batch_size:
                await self._batch(batch)
                batch = []
        if batch:
            await self._batch(batch)
        return self.counts

    async def _batch(self, accounts: list[SynapseAccount]) -> None:
        # LOOKUPS at a time, as the check's: an LDAP store queues them on its small pool, and
        # the wait counts in each lookup's timeout.
        found: list[User | None] = []
        for start in range(0, len(accounts), LOOKUPS):
            chunk = accounts[start:start + LOOKUPS]
            found += await asyncio.gather(*(self.users.get(a.user.localpart, case_insensitive=True) for a in chunk))
        plans = [await self._plan(account, stored) for account, stored in zip(accounts, found, strict=True)]
        batch, records = await self._without_known(plans)
        if not self.dry_run:
            await self._write(batch, records)
        self.counts.users += len(accounts)
        if self.progress is not None:
            self.progress(self.counts.users, self._total)

    async def _plan(self, account: SynapseAccount, stored: User | None) -> UserPlan:
        user, counts = account.user, self.counts
        plan = UserPlan(account.user.localpart, place(account, stored, directory=self.directory), stored)
        if plan.kind == DEACTIVATED:
            counts.deactivated += 1
            return plan
        if not plan.moved:
            counts.not_moved.add(f"{plan.name} ({plan.kind.replace('_', ' ')})")
            return plan
        if plan.kind == ADDED:
            plan.record = new_record(account, await self._free_address(plan.name, account.emails))
        assert plan.record is not None
        if plan.kind != ADDED:
            if user.locked and not plan.record.locked:
                counts.locked_elsewhere.add(plan.name)
            if user.admin and not plan.record.admin and plan.name not in self.admins:
                counts.admins_elsewhere.add(plan.name)
        self.planner.sessions(plan, account, self.credentials.of(plan.record))
        return plan

    async def _free_address(self, name: str, emails: list[str]) -> str | None:
        """The first address of a user unless another user here holds it (logins by address
        need one holder); None for none."""
        if not emails:
            return None
        address = emails[0]
        canonical = canonical_email(address)
        if canonical is None or [u for u in await self.users.by_email(address) if u.name != name]:
            self.counts.emails_taken.add(f"{name} ({address})")
            return None
        return address

    async def _without_known(self, plans: list[UserPlan]) -> tuple[ImportBatch, list[User]]:
        """The batch to write, less what an earlier run carried; counted."""
        counts = self.counts
        digests = [digest for plan in plans for digest, _ in plan.tokens]
        known = await self.imported.known_tokens(digests)
        batch = ImportBatch()
        records: list[User] = []
        for plan in plans:
            if plan.kind == DEACTIVATED:
                batch.deactivated.append(plan.name)
                continue
            if not plan.moved:
                continue
            counts.added += plan.kind == ADDED
            counts.kept += plan.kind == KEPT
            counts.directory += plan.kind == DIRECTORY
            if plan.kind == ADDED and plan.record is not None:
                records.append(plan.record)
            counts.devices += plan.devices
            counts.dropped_refresh += plan.dropped_refresh
            for digest, kind in plan.kinds.items():
                if digest not in known:
                    counts.access += kind == ACCESS
                    counts.refresh += kind == REFRESH
                    counts.device_only += kind == DEVICE
            # A grant carried before: its own session was too.
            done = known | {grant_session_digest(g.grant_id) for g, _ in plan.grants if g.refresh_hash in known}
            batch.sessions.extend((s, name) for s, name in plan.sessions if s.token_hash not in done)
            batch.grants.extend((g, idle) for g, idle in plan.grants if g.refresh_hash not in known)
            batch.tokens.extend((digest, user) for digest, user in plan.tokens if digest not in known)
        counts.already += len(known)
        return batch, records

    async def _write(self, batch: ImportBatch, records: list[User]) -> None:
        if batch:
            await self.imported.add(batch)
        try:
            if records:
                added = set(await self.backend.add_users(records))
                # A record another hand wrote meanwhile stays the store's.
                self.counts.added -= len(records) - len(added)
                self.counts.kept += len(records) - len(added)
        except BaseException:
            with contextlib.suppress(Exception):
                await self.imported.undo(batch)
            raise
