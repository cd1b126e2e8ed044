"""When and where the directory sweep runs: every `[delegation] sync_interval` seconds in one
process of all those serving on the session store (every worker, every machine), and on
demand (`run.py delegation sync --all`).

The session store holds the sweep's lease (DelegationState.claim_sweep): a process takes it
only when it is free and a sweep is due (the last one started an interval ago or more, by the
store's clock), renews it while it sweeps, and gives it back at the end; a process that dies
sweeping loses it after LEASE_TTL. Every process looks whether a sweep is due every
min(interval, LOOK_EVERY) seconds (jittered), so one sweep runs per interval, not one per
process. A sweep on demand takes the lease whenever it is free (it waits for one running
elsewhere to end); a dry run takes nothing, since it changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import secrets
import socket
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from backends.base import StoreUnavailable
from backends.sessions.delegation import DelegationState
from homeserver.delegation.sweep import DirectorySweep
from homeserver.delegation.sweep_report import SweepReport

if TYPE_CHECKING:
    from homeserver.metrics import Metrics

logger = logging.getLogger(__name__)

LEASE_TTL = 60.0  # seconds a lease lives unless renewed (renewed every third of it)
LOOK_EVERY = 60.0  # at most this many seconds between two looks at whether a sweep is due


class SweepBusy(Exception):
    """Another process's sweep held the lease for longer than a sweep on demand waits."""


class SweepLost(Exception):
    """The sweep lost its lease (the session store did not renew it in time): it stopped."""


class Sweeper:
    """Runs `sweep` once per `interval` seconds in one process of all those on `state`'s store."""

    def __init__(
        self,
        sweep: DirectorySweep,
        state: DelegationState,
        interval: float,
        *,
        lease_ttl: float = LEASE_TTL,
        metrics: Metrics | None = None,
    ) -> None:
        self.sweep = sweep
        self.state = state
        self.interval = interval
        self.lease_ttl = lease_ttl
        self.metrics = metrics
        # Who holds the lease, in words an operator can place: host, process, and a nonce.
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"

    async def run_forever(self) -> None:
        """Sweep whenever one is due, until cancelled; a failure is logged, never raised."""
        look = min(self.interval, LOOK_EVERY)
        while True:
            await asyncio.sleep(look * random.uniform(0.9, 1.1))
            try:
                await self.sweep_if_due()
            except StoreUnavailable as exc:
                logger.warning("directory sweep skipped: %s", exc)
            except SweepLost as exc:
                logger.warning("directory sweep stopped: %s", exc)
                self._failed()
            except Exception:
                logger.exception("directory sweep failed")
                self._failed()

    async def sweep_if_due(self) -> SweepReport | None:
        """Sweep if no process does and none did less than an interval ago; None if not."""
        if not await self.state.claim_sweep(self.holder, self._ms(self.lease_ttl), self._ms(self.interval)):
            return None
        return await self._holding(self.sweep.run())

    async def sweep_now(
        self,
        *,
        dry_run: bool = False,
        allow_deactivations: bool = False,
        out: Callable[[str], None] | None = None,
        wait: float | None = None,
    ) -> SweepReport:
        """One sweep now (`delegation sync --all`), after one running elsewhere ends (waiting
        up to `wait` seconds, the lease's life by default: SweepBusy after)."""
        if dry_run:
            return await self.sweep.run(dry_run=True, allow_deactivations=allow_deactivations, out=out)
        deadline = time.monotonic() + (self.lease_ttl if wait is None else wait)
        said = False
        while not await self.state.claim_sweep(self.holder, self._ms(self.lease_ttl), None):
            if time.monotonic() >= deadline:
                raise SweepBusy("another process is sweeping the user store; try again when it is done")
            if not said and out is not None:
                out("Another process is sweeping the user store; waiting for it to finish.")
                said = True
            await asyncio.sleep(0.5)
        return await self._holding(self.sweep.run(allow_deactivations=allow_deactivations, out=out))

    async def _holding(self, work: Coroutine[Any, Any, SweepReport]) -> SweepReport:
        """Run the sweep while renewing the lease; stop it (SweepLost) if the lease is lost."""
        task = asyncio.ensure_future(work)
        lost: list[str] = []
        renewer = asyncio.ensure_future(self._renew(task, lost))
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if lost and (current is None or not current.cancelling()):
                raise SweepLost(lost[0]) from None
            raise
        finally:
            renewer.cancel()
            with contextlib.suppress(StoreUnavailable, asyncio.CancelledError):
                await self.state.release_sweep(self.holder)

    async def _renew(self, task: asyncio.Task[SweepReport], lost: list[str]) -> None:
        """Renew every third of the lease's life; a store that cannot answer is tried again
        until the lease would have run out."""
        renewed_at = time.monotonic()
        while not task.done():
            await asyncio.sleep(self.lease_ttl / 3)
            try:
                if await self.state.renew_sweep(self.holder, self._ms(self.lease_ttl)):
                    renewed_at = time.monotonic()
                    continue
                why = "another process took its lease"
            except StoreUnavailable as exc:
                if time.monotonic() - renewed_at < self.lease_ttl * 2 / 3:
                    continue
                why = f"its lease could not be renewed ({exc})"
            lost.append(why)
            task.cancel()
            return

    def _failed(self) -> None:
        if self.metrics is not None:
            self.metrics.observe_sweep_failed()

    @staticmethod
    def _ms(seconds: float) -> int:
        return int(seconds * 1000)
