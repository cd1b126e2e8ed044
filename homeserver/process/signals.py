"""The server's signals on its event loop: SIGTERM/SIGINT stop (a second one hurries the
drain), SIGHUP reloads, from before start-up begins to after the drain ends.

`LoopSignals` takes them over from `early_signals.EarlySignals` (which noted them since
run.py's first lines) with `loop.add_signal_handler`, whose self-pipe wakes an idle loop at
once, adopts what was noted, and hands them back before the loop closes: a SIGTERM at any
moment of a server's life starts its drain (or ends its start-up), none is lost.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from typing import TypeVar

from homeserver.process.early_signals import HANDLED, STOP, EarlySignals

T = TypeVar("T")


class LoopSignals:
    """On the event loop: the first SIGTERM/SIGINT sets `stop`, any later one `hurry`
    (cut the drain short); SIGHUP calls `on_reload` once set (start-up done)."""

    def __init__(self, early: EarlySignals) -> None:
        self.early = early
        self.stop = asyncio.Event()
        self.hurry = asyncio.Event()
        self.signal_name = ""
        self.on_reload: Callable[[], None] | None = None
        self.reload_pending = False

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Take the signals over on `loop`, then act on any noted before (none falls between)."""
        for sig in STOP:
            loop.add_signal_handler(sig, self._on_stop, sig)
        loop.add_signal_handler(signal.SIGHUP, self._on_reload)
        for signum in self.early.stops:
            self._on_stop(signum)
        if self.early.reloads:
            self._on_reload()
        self.early.reset()

    def uninstall(self, loop: asyncio.AbstractEventLoop) -> None:
        """Hand the signals back to `early` before the loop closes (closing, a loop puts back
        the default actions, and a SIGTERM then would kill the process)."""
        signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
        try:
            for sig in HANDLED:
                loop.remove_signal_handler(sig)
                signal.signal(sig, self.early.note)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)

    def _on_stop(self, signum: int) -> None:
        self.request_stop(signal.Signals(signum).name)

    def request_stop(self, why: str) -> None:
        """Stop (`why`: the signal's name, or another reason); a second request hurries."""
        if self.stop.is_set():
            self.hurry.set()
            return
        self.signal_name = why
        self.stop.set()

    def _on_reload(self) -> None:
        if self.on_reload is None:
            self.reload_pending = True  # start-up reads the store anyway; read it once more after
        else:
            self.on_reload()

    def reloads_from_now(self, on_reload: Callable[[], None]) -> None:
        """Start-up is done: SIGHUP calls `on_reload`, at once if one came during start-up."""
        self.on_reload = on_reload
        if self.reload_pending:
            self.reload_pending = False
            on_reload()

    async def unless_stopped(self, work: Awaitable[T]) -> tuple[bool, T | None]:
        """Run `work` unless a stop comes first: (True, its result), or (False, None) with
        `work` cancelled (and awaited, so its own clean-up has run)."""
        task = asyncio.ensure_future(work)
        stopped = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            task.cancel()
            raise
        finally:
            stopped.cancel()
        if task.done():
            return True, task.result()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        except Exception:  # start-up failing while cancelled: the stop wins, nothing to report
            pass
        return False, None
