"""One pass over a Synapse's accounts, set against this server's user store: what a move would
carry and what it would leave behind, counted (and named, a few at a time).

A user is *moved* when this server can serve them after the switch: not a guest, not an
application service's, not deactivated, approved, and present under the same name in the
store (an LDAP directory: found there; a file or Redis store: found there, or bringing a
Synapse bcrypt hash to import). The run's own rule says so (homeserver/migration/plan.py
`place`). Only a moved user's live tokens are carried.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field

from backends.base import User
from backends.synapse.database import SynapseDatabase
from backends.synapse.rows import SynapseAccount, TokenFate
from homeserver.migration.plan import ADDED, DIRECTORY, KEPT, place
from homeserver.synapse_tokens import names_its_user
from homeserver.users import Users

# Names shown per finding; the rest are counted.
SAMPLE = 10
# Store lookups in flight at once (an LDAP store queues them on its connection pool).
LOOKUPS = 32


@dataclass
class Names:
    """A count, and the first few names counted (in user ID order)."""

    count: int = 0
    sample: list[str] = field(default_factory=list)

    def add(self, name: str) -> None:
        self.count += 1
        if len(self.sample) < SAMPLE:
            self.sample.append(name)

    def __str__(self) -> str:
        more = self.count - len(self.sample)
        return ", ".join(self.sample) + (f" and {more} more" if more else "")


@dataclass
class Survey:
    users: int = 0
    admins: Names = field(default_factory=Names)
    deactivated: int = 0
    locked: int = 0
    guests: int = 0
    appservices: Counter[str] = field(default_factory=Counter)
    unapproved: Names = field(default_factory=Names)
    hashes: int = 0  # moved users bringing a Synapse password hash
    hash_costs: Counter[int] = field(default_factory=Counter)  # their bcrypt costs
    no_hash: Names = field(default_factory=Names)  # file/Redis: not in the store and no hash
    bad_hash: Names = field(default_factory=Names)  # file/Redis: not in the store, a hash that is no bcrypt
    ours: Names = field(default_factory=Names)  # already in the store under the same name
    case_only: Names = field(default_factory=Names)  # in the store under another case
    missing: Names = field(default_factory=Names)  # LDAP: not in the directory
    returning: Names = field(default_factory=Names)  # deactivated at Synapse, yet in the store
    # Synapse admins the store already has without marking them admin (record, admin_filter),
    # and not in [delegation] admins: admins no more after the switch. Those the move adds
    # to a file/Redis store get the record's admin mark.
    unmarked_admins: Names = field(default_factory=Names)
    directory_hashes: int = 0  # LDAP: in the directory, with a Synapse hash left unused
    devices: int = 0
    access: Counter[TokenFate] = field(default_factory=Counter)
    access_left: int = 0  # live, but of users not moved
    # Live and carried, but not naming their user (an older Synapse's macaroons): found by digest.
    by_digest: int = 0
    refresh: Counter[TokenFate] = field(default_factory=Counter)
    refresh_left: int = 0
    phone_numbers: int = 0
    several_emails: int = 0
    external_ids: dict[str, int] = field(default_factory=dict)
    orphans: int = 0


class Surveyor:
    """Walks `database.accounts()` once; `directory` says the store is LDAP (it keeps its own
    passwords, so no Synapse hash is imported into it)."""

    def __init__(self, users: Users, *, directory: bool, now_ms: int, admins: frozenset[str] = frozenset()) -> None:
        self.users = users
        self.directory = directory
        self.admins = admins  # [delegation] admins
        self.now_ms = now_ms
        self.survey = Survey()

    async def run(self, database: SynapseDatabase, server_name: str) -> Survey:
        batch: list[SynapseAccount] = []
        for account in database.accounts(server_name):
            batch.append(account)
            if len(batch) >= LOOKUPS:
                await self._batch(batch)
                batch = []
        await self._batch(batch)
        self.survey.orphans = database.orphans
        self.survey.external_ids = database.external_id_counts()
        return self.survey

    async def _batch(self, accounts: list[SynapseAccount]) -> None:
        wanted = [a for a in accounts if self._candidate(a)]
        found = await asyncio.gather(*(self.users.get(a.user.localpart, case_insensitive=True) for a in wanted))
        stored = {a.user.user_id: user for a, user in zip(wanted, found, strict=True)}
        for account in accounts:
            self._account(account, stored.get(account.user.user_id))

    @staticmethod
    def _candidate(account: SynapseAccount) -> bool:
        """Users looked up in the store: all but guests, application services' and the unapproved."""
        user = account.user
        return not (user.is_guest or user.appservice_id or not user.approved)

    def _account(self, account: SynapseAccount, stored: User | None) -> None:
        survey, user = self.survey, account.user
        name = user.localpart
        survey.users += 1
        if user.admin:
            survey.admins.add(name)
        survey.locked += user.locked
        survey.deactivated += user.deactivated
        survey.guests += user.is_guest
        if user.appservice_id:
            survey.appservices[user.appservice_id] += 1
        if not user.approved:
            survey.unapproved.add(name)
        if user.deactivated:
            moved = False
            if stored is not None:  # the store would let them log in again
                survey.returning.add(name)
        else:
            moved = self._moved(place(account, stored, directory=self.directory), name, user.password_hash, stored)
            if moved and user.admin and stored is not None and not stored.admin and name not in self.admins:
                survey.unmarked_admins.add(name)
        survey.devices += len(account.devices)
        for token in account.access_tokens:
            fate = token.fate(self.now_ms)
            survey.access[fate] += 1
            survey.access_left += fate is TokenFate.LIVE and not moved
            survey.by_digest += fate is TokenFate.LIVE and moved and not names_its_user(token.token, name)
        for refresh in account.refresh_tokens:
            fate = refresh.fate(self.now_ms)
            survey.refresh[fate] += 1
            survey.refresh_left += fate in (TokenFate.LIVE, TokenFate.SUPERSEDED) and not moved
        survey.phone_numbers += sum(t.medium != "email" for t in account.threepids)
        survey.several_emails += len(account.emails) > 1

    def _moved(self, kind: str, name: str, password_hash: str | None, stored: User | None) -> bool:
        """Count one user where the run puts them (`kind`, plan.place's); True if moved."""
        survey = self.survey
        if kind == "case_only" and stored is not None:
            survey.case_only.add(f"{name} ({stored.name} here)")
        elif kind == "missing":
            survey.missing.add(name)
        elif kind == "no_hash":
            survey.no_hash.add(name)
        elif kind == "bad_hash":
            survey.bad_hash.add(name)
        elif kind == DIRECTORY:
            survey.directory_hashes += password_hash is not None
        elif kind == KEPT:
            survey.ours.add(name)
        elif kind == ADDED and password_hash is not None:
            survey.hashes += 1
            survey.hash_costs[_cost(password_hash)] += 1
        return kind in (ADDED, KEPT, DIRECTORY)


def _cost(password_hash: str) -> int:
    """bcrypt's cost from `$2b$12$...`; 0 for a hash that is no bcrypt."""
    parts = password_hash.split("$")
    return int(parts[2]) if len(parts) > 3 and parts[2].isdigit() else 0
