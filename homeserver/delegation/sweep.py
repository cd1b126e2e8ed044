"""The directory sweep: Synapse made to follow the whole user store (docs/delegation.md, "The
directory's lifecycle").

One sweep reads every user of the store (`Users.list_all`), then:

1. provisions at Synapse every user who is new or changed there since it was last told
   (the digest the session store keeps, as a login keeps it): an unchanged user costs no
   call; a user it had deactivated is reactivated first; a lock alone sends only the lock;
2. ends at once the sessions here of users no longer in the store (each confirmed by a
   lookup of its own, so a user added after the listing keeps a session just opened), and
   those opened with a credential since changed (the session sweep's work, done here);
3. deactivates at Synapse (`erase: false`) the users provisioned there who have been
   missing from the store for `deactivate_after` seconds, each confirmed by a lookup too.

**The guard**: a sweep that could not read the whole store (StoreIncomplete), or that finds
fewer than half of the users the previous one found, deactivates no one (it may still
provision the users it read, and end the sessions of users a lookup says are gone), says
why in one warning line and a metric, and keeps the previous count to compare with, so the
next sweeps hold back too until a whole, larger listing comes or an operator confirms with
`delegation sync --all --allow-deactivations`.

Users an admin deactivated at Synapse itself (the migration's list, issue 35) are neither
provisioned nor reactivated: `DeactivatedAtSynapse`, given when built.

Never holding the loop: users are taken in batches with a yield between them, and at most
SYNAPSE_CONCURRENCY calls to Synapse run at once. When Synapse does not answer or refuses
our secret, the sweep stops calling it at the first such answer; the rest waits for the next.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable
from typing import TYPE_CHECKING, Protocol, TypeVar

from backends.base import StoreIncomplete, StoreUnavailable, User
from backends.sessions.delegation import DEACTIVATED, DEACTIVATING
from homeserver.delegation.provisioning import profile_digest
from homeserver.delegation.service import Delegation
from homeserver.delegation.sweep_report import INCOMPLETE, SHRUNK, SweepReport
from homeserver.delegation.synapse import SynapseError, SynapseMisconfigured, SynapseUnreachable
from homeserver.devices import Devices
from homeserver.names import possible_name, user_id
from homeserver.sessions import USER_REMOVED
from homeserver.users import Users

if TYPE_CHECKING:
    from homeserver.metrics import Metrics

logger = logging.getLogger(__name__)
T = TypeVar("T")

# Calls to Synapse at once. Synapse writes a user in ~15-20 ms on its one thread: two keep it
# busy across each round trip, more only queue there in front of its clients' requests
# (bench/sweep.py, docs/performance.md: 1 at once 44 users/s, 2 71/s, 4 62/s).
SYNAPSE_CONCURRENCY = 2
# Users looked at between two yields to the loop (digests, store reads).
BATCH = 250


class DeactivatedAtSynapse(Protocol):
    """The users an admin deactivated at Synapse itself (the migration keeps them, issue 35):
    the sweep neither provisions nor reactivates them."""

    async def deactivated_users(self) -> Collection[str]:
        """Their names, all at once."""


def batches(items: list[T], size: int = BATCH) -> Iterable[list[T]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def when(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


class DirectorySweep:
    """One sweep of the whole user store at a time (the Sweeper says when, and makes sure one
    process of all those serving does it)."""

    def __init__(
        self,
        delegation: Delegation,
        users: Users,
        devices: Devices,
        *,
        deactivate_after: float,
        deactivated_at_synapse: DeactivatedAtSynapse | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
        concurrency: int = SYNAPSE_CONCURRENCY,
    ) -> None:
        self.delegation = delegation
        self.state = delegation.state
        self.users = users
        self.devices = devices
        self.deactivate_after_ms = int(deactivate_after * 1000)
        self.deactivated_at_synapse = deactivated_at_synapse
        self.metrics = metrics
        self.clock = clock
        self.concurrency = concurrency
        self._calls = asyncio.Semaphore(concurrency)

    async def run(
        self, *, dry_run: bool = False, allow_deactivations: bool = False, out: Callable[[str], None] | None = None
    ) -> SweepReport:
        """Sweep once; `dry_run` changes nothing anywhere (no call to Synapse, no write, no
        session ended) and says what it would do; `out` takes one line per user acted on.
        Raises StoreUnavailable when the session store cannot answer."""
        report = SweepReport(dry_run=dry_run, out=out)
        unreadable: set[str] = set()
        incomplete: str | None = None
        try:
            listed = await self.users.list_all()
        except StoreIncomplete as exc:
            listed, unreadable, incomplete = exc.users, set(exc.unreadable), exc.reason
        by_name = {user.name: user for user in listed}
        told = await self.state.provisioned_all()
        missing = await self.state.missing()
        left_alone: set[str] = set()
        if self.deactivated_at_synapse is not None:
            left_alone = set(await self.deactivated_at_synapse.deactivated_users())
        report.found = len(by_name)
        reference = await self.state.sweep_reference()
        self._guard(report, incomplete, reference, told, allow_deactivations)

        await self._provision(listed, told, left_alone, report)
        in_store = by_name.keys() | unreadable
        back = [name for name in missing if name in in_store]
        if back and not dry_run:
            await self.state.clear_missing(back)
        await self._end_sessions(by_name, unreadable, report)
        await self._deactivate(told, missing, in_store, left_alone, report)
        if report.guard is None and not dry_run and report.synapse_problem is None:
            await self.state.set_sweep_reference(report.found)
        report.finish()
        if not dry_run:
            logger.info("%s", report.summary())
            guard = report.guard_line()
            if guard is not None:
                logger.warning("%s", guard)
            if self.metrics is not None:
                self.metrics.observe_sweep(report)
        return report

    # -- the guard --------------------------------------------------------------------------

    def _guard(self, report: SweepReport, incomplete: str | None, reference: int | None, told: dict[str, str],
               allow: bool) -> None:
        if incomplete is not None:
            report.guard, report.why = INCOMPLETE, f"the user store could not be read whole ({incomplete})"
            return
        if reference is None:  # no sweep before: the users provisioned at Synapse so far
            reference = sum(1 for digest in told.values() if digest != DEACTIVATED)
        if report.found * 2 < reference and not allow:
            report.guard = SHRUNK
            report.why = f"it found {report.found} users, fewer than half of the {reference} the previous sweep found"

    # -- 1. the users in the store ----------------------------------------------------------

    async def _provision(self, listed: list[User], told: dict[str, str], left_alone: set[str],
                         report: SweepReport) -> None:
        for batch in batches(listed):
            changed: list[tuple[User, str | None, str]] = []
            for user in batch:
                if user.name in left_alone:
                    report.skipped += 1
                    continue
                digest = profile_digest(user)
                previous = told.get(user.name)
                if previous == digest:
                    report.unchanged += 1
                elif not possible_name(user.name):
                    report.failed += 1
                else:
                    changed.append((user, previous, digest))
            await asyncio.gather(*(self._provision_one(user, previous, digest, report)
                                   for user, previous, digest in changed))
            await asyncio.sleep(0)  # the loop serves requests between batches

    async def _provision_one(self, user: User, previous: str | None, digest: str, report: SweepReport) -> None:
        action = "reactivate" if previous in (DEACTIVATED, DEACTIVATING) else "create" if previous is None else "update"
        if report.dry_run:
            self._count(report, {"reactivate": "reactivated", "create": "created"}.get(action, "updated"))
            report.say(f"{self._id(user.name)}: would {action} at Synapse")
            return
        done = await self._at_synapse(report, user.name, lambda: self.delegation.provision(user, previous, digest))
        if done is not None:
            self._count(report, done)
            report.say(f"{self._id(user.name)}: {done} at Synapse")

    @staticmethod
    def _count(report: SweepReport, done: str) -> None:
        if done == "reactivated":
            report.reactivated += 1
        else:
            report.provisioned += 1
            report.created += done == "created"

    # -- 2. the sessions here ---------------------------------------------------------------

    async def _end_sessions(self, by_name: dict[str, User], unreadable: set[str], report: SweepReport) -> None:
        """End the sessions of users no longer in the store (each confirmed by a lookup), and
        those opened with a credential since changed (not in a dry run)."""
        names = sorted(await self.devices.sessions.store.users())
        for batch in batches(names):
            for name in batch:
                user = by_name.get(name)
                if user is not None:
                    if not report.dry_run:
                        await self.devices.end_stale(user)
                    continue
                if name in unreadable:
                    continue
                try:
                    if await self.users.get(name) is not None:
                        continue  # added since the listing (it may have just logged in)
                except StoreUnavailable as exc:
                    logger.warning("directory sweep: sessions of users gone from the store not ended yet: %s", exc)
                    return
                report.sessions_ended += 1
                if report.dry_run:
                    report.say(f"{self._id(name)}: would end the sessions here (no longer in the user store)")
                else:
                    count = await self.devices.end(name, None, USER_REMOVED)
                    report.say(f"{self._id(name)}: ended {count} session{'s' * (count != 1)} here "
                               "(no longer in the user store)")
            await asyncio.sleep(0)

    # -- 3. the users missing from the store ------------------------------------------------

    async def _deactivate(self, told: dict[str, str], missing: dict[str, int], in_store: Collection[str],
                          left_alone: set[str], report: SweepReport) -> None:
        now = int(self.clock() * 1000)
        newly: dict[str, int] = {}
        due: list[tuple[str, int]] = []
        for name, digest in told.items():
            if name in in_store or name in left_alone or digest == DEACTIVATED:
                continue
            since = missing.get(name)
            if since is None:
                if report.guard == INCOMPLETE:
                    continue  # a listing not read whole says nothing of who is missing
                since = newly[name] = now
            if now - since >= self.deactivate_after_ms and report.guard is None:
                due.append((name, since))
            else:
                report.waiting += 1
        if newly and not report.dry_run:
            await self.state.set_missing(newly)
        for batch in batches(due, self.concurrency * 4):
            await asyncio.gather(*(self._deactivate_one(name, since, report) for name, since in batch))

    async def _deactivate_one(self, name: str, since: int, report: SweepReport) -> None:
        reason = f"missing from the user store since {when(since)}"
        try:
            if await self.users.get(name) is not None:
                return  # back since the listing
        except StoreUnavailable:
            report.waiting += 1
            return
        if report.dry_run:
            report.deactivated += 1
            report.say(f"{self._id(name)}: would deactivate at Synapse ({reason})")
            return

        async def deactivate() -> str:
            await self.delegation.deactivate(name, reason)
            await self.state.clear_missing([name])
            return "deactivated"

        if await self._at_synapse(report, name, deactivate) is not None:
            report.deactivated += 1
            report.say(f"{self._id(name)}: deactivated at Synapse ({reason})")

    # -- Synapse ----------------------------------------------------------------------------

    async def _at_synapse(self, report: SweepReport, name: str, call: Callable[[], Awaitable[str]]) -> str | None:
        """One user's calls to Synapse, under the user's lock (a login here waits) and the
        bound on calls at once; None when they failed (counted, left to the next sweep)."""
        if report.synapse_problem is not None:
            report.failed += 1
            return None
        async with self._calls, self.delegation.locks.hold(name):
            if report.synapse_problem is not None:
                report.failed += 1
                return None
            try:
                return await call()
            except (SynapseUnreachable, SynapseMisconfigured) as exc:
                report.failed += 1
                if report.synapse_problem is None:
                    report.synapse_problem = str(exc)
                    logger.warning("directory sweep: Synapse did not answer (%s): the rest waits for the next sweep",
                                   exc)
            except SynapseError as exc:
                report.failed += 1
                logger.warning("directory sweep: Synapse refused %r: %s", name, exc)
            return None

    def _id(self, name: str) -> str:
        return user_id(name, self.delegation.server_name)
