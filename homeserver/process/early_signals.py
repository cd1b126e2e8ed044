"""Stop and reload signals noted from run.py's first lines, before any event loop exists.

Before this, a server process met SIGTERM, SIGINT and SIGHUP with whatever disposition it
was started with until its event loop installed handlers at the end of start-up (imports,
config, stores: a few tenths of a second, seconds on a loaded machine or with a slow
directory): the default action (a single process killed on the spot, exit status 143 with no
"shutting down" line, in the middle of a schema migration; a SIGHUP from `systemctl
reload` killed it too, and systemd counts that as a clean exit), an inherited SIG_IGN (the
signal lost: the server then served on), an inherited blocked mask (every signal held),
and in a worker a SystemExit raised into whatever start-up code ran.

`EarlySignals` only notes each signal (nothing runs inside a handler); the server's loop
takes them over and acts on what was noted (homeserver.process.signals). Every other command
gets the signals back as they were (`release`), noted ones sent again. Imports nothing but
`signal`: it is installed before the rest of the program is imported.
"""

from __future__ import annotations

import signal
from typing import Any

STOP = (signal.SIGTERM, signal.SIGINT)
HANDLED = (*STOP, signal.SIGHUP)


class EarlySignals:
    """Notes stop and reload signals until an event loop takes them over."""

    def __init__(self) -> None:
        self.stops: list[int] = []
        self.reloads = 0
        # What the process had before the first install (restored by release).
        self._inherited: dict[int, Any] | None = None
        self._blocked: set[int] = set()

    def install(self) -> None:
        """Handle the signals from here on, whatever the process inherited (ignored or blocked)."""
        if self._inherited is None:
            self._inherited = {sig: signal.getsignal(sig) for sig in HANDLED}
            self._blocked = set(signal.pthread_sigmask(signal.SIG_BLOCK, [])) & set(HANDLED)
        for sig in HANDLED:
            signal.signal(sig, self.note)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)

    def release(self) -> None:
        """Give the signals back as the process had them and send again those noted meanwhile
        (a command other than `serve`: Ctrl-C during its imports still stops it)."""
        if self._inherited is None:
            return
        for sig, handler in self._inherited.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._inherited = None
        if self._blocked:
            signal.pthread_sigmask(signal.SIG_BLOCK, self._blocked)
        noted = [*self.stops, *[signal.SIGHUP] * min(self.reloads, 1)]
        self.reset()
        for sig in noted:
            signal.raise_signal(sig)

    def reset(self) -> None:
        """Forget what was noted (a forked worker starts with nothing pending)."""
        self.stops.clear()
        self.reloads = 0

    def note(self, signum: int, frame: object) -> None:
        if signum == signal.SIGHUP:
            self.reloads += 1
        else:
            self.stops.append(signum)

    @property
    def stop_requested(self) -> bool:
        return bool(self.stops)

    @property
    def stop_name(self) -> str:
        """The first stop signal's name ("SIGTERM"), "" when none came."""
        return signal.Signals(self.stops[0]).name if self.stops else ""


# The process's own, installed by run.py before the program is imported.
EARLY = EarlySignals()
