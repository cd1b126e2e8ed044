"""What one directory sweep did (or, with `--dry-run`, would do): its counts, its summary line,
why the guard held deactivations back, and its lines for `delegation sync --all`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

# Why the guard held every deactivation back (the metric's `reason` label).
INCOMPLETE = "incomplete"  # the store could not be read whole
SHRUNK = "shrunk"  # fewer than half of the users the previous sweep found
GUARD_REASONS = (INCOMPLETE, SHRUNK)


@dataclass
class SweepReport:
    """The counts of one sweep. `provisioned` counts users created or updated at Synapse
    (`created` of them new there); `waiting` users missing from the store whose deactivation
    waits (`deactivate_after`, or the guard); `failed` users Synapse refused or did not answer
    for (left to the next sweep); `skipped` users an admin deactivated at Synapse itself."""

    dry_run: bool = False
    found: int = 0
    provisioned: int = 0
    created: int = 0
    reactivated: int = 0
    deactivated: int = 0
    unchanged: int = 0
    waiting: int = 0
    sessions_ended: int = 0
    failed: int = 0
    skipped: int = 0
    guard: str | None = None  # INCOMPLETE or SHRUNK: no one was deactivated
    why: str = ""  # the guard's reason in words, or what stopped the calls to Synapse
    synapse_problem: str | None = None  # Synapse away or refusing our secret: the rest waits
    seconds: float = 0.0
    started: float = field(default_factory=time.perf_counter, repr=False)
    out: Callable[[str], None] | None = field(default=None, repr=False)

    def say(self, line: str) -> None:
        """One line of what was done to one user, for `delegation sync --all` (not the log)."""
        if self.out is not None:
            self.out(line)

    def finish(self) -> None:
        self.seconds = time.perf_counter() - self.started

    def summary(self) -> str:
        """The sweep's one summary line: provisioned, deactivated, reactivated, unchanged, seconds."""
        if self.dry_run:
            head = "directory sweep (dry run)"
            did = [f"{self.provisioned} to provision ({self.created} new)", f"{self.deactivated} to deactivate",
                   f"{self.reactivated} to reactivate"]
        else:
            head = "directory sweep"
            did = [f"{self.provisioned} provisioned ({self.created} new)", f"{self.deactivated} deactivated",
                   f"{self.reactivated} reactivated"]
        did.append(f"{self.unchanged} unchanged")
        more = []
        if self.waiting:
            more.append(f"{self.waiting} missing and waiting")
        if self.sessions_ended:
            ended = "would have ended" if self.dry_run else "ended"
            more.append(f"{ended} the sessions of {self.sessions_ended} no longer in the store")
        if self.failed:
            more.append(f"{self.failed} failed (left to the next sweep)")
        if self.skipped:
            more.append(f"{self.skipped} deactivated at Synapse by an admin (left alone)")
        tail = "".join(f"; {part}" for part in [", ".join(more)] if more)
        return f"{head}: {self.found} users in the user store: {', '.join(did)}{tail}; {self.seconds:.1f} s"

    def guard_line(self) -> str | None:
        """The one warning line when the guard held deactivations back."""
        if self.guard is None:
            return None
        if self.guard == SHRUNK:
            advice = "if the store is right, confirm with `run.py delegation sync --all --allow-deactivations`"
        else:
            advice = "the next sweep that reads the whole store will"
        return f"directory sweep: deactivated no one at Synapse: {self.why}; {advice}"
