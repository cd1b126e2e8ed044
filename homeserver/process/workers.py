"""Run N worker processes on one listening socket, restart crashed ones, stop them on a signal."""

from __future__ import annotations

import asyncio
import collections
import ctypes
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import NoReturn

from homeserver.process.early_signals import EARLY, EarlySignals

logger = logging.getLogger(__name__)

# A worker that exits with this code (sysexits' EX_CONFIG) failed its configuration:
# restarting it cannot help, so the whole server stops.
EXIT_CONFIG = 78
# More crashes than this within the window stop the server instead of looping forever.
MAX_RESTARTS = 5
RESTART_WINDOW = 30.0
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


# prctl(2) option: the signal this process gets when its parent dies.
PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> bool:
    """Have Linux send this worker SIGTERM (a graceful stop) when `parent` dies.

    So a `kill -9` of the parent leaves no orphans holding the port. True if set;
    elsewhere (or if refused) `watch_parent` alone notices, within its interval.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            logger.debug("prctl(PR_SET_PDEATHSIG) failed: %s", os.strerror(ctypes.get_errno()))
            return False
    except (OSError, AttributeError):
        return False
    return True


async def watch_parent(parent: int, on_gone: Callable[[], None], interval: float = 1.0) -> None:
    """Call `on_gone` once this process is no longer `parent`'s child (it died; we were re-parented).

    The portable fallback to PR_SET_PDEATHSIG, and a second line of defence on Linux.
    """
    while os.getppid() == parent:
        await asyncio.sleep(interval)
    logger.warning("parent process %d is gone; stopping", parent)
    on_gone()


def run_workers(
    count: int, target: Callable[[int], int], early: EarlySignals = EARLY, on_stop: Callable[[], None] | None = None
) -> int:
    """Fork `count` children running `target(index)`; return 0 when all stopped cleanly.

    Must be called before any thread or event loop exists in this process: children are
    plain forks. SIGTERM or SIGINT to this process is forwarded as SIGTERM so each worker
    drains its requests; SIGHUP is forwarded as is (reload the users file). A worker that
    dies on its own is restarted, within limits. `early` noted the signals until now: a
    stop noted there starts no worker. `on_stop` runs once, when the stop begins.
    """
    workers = Workers(target, early, on_stop)
    for sig in FORWARDED:
        signal.signal(sig, workers.on_signal)
    if early.stop_requested:
        logger.info("shutting down: %s during start-up, nothing served", early.stop_name)
        workers.stop_all()
        return 0
    for index in range(count):
        if workers.stopping:  # a stop came between two forks: those started have it, start no more
            break
        workers.spawn(index)
    while workers.children:
        try:
            pid, status = os.wait()  # a signal handler runs, then the wait resumes (PEP 475)
        except ChildProcessError:
            break
        workers.exited(pid, os.waitstatus_to_exitcode(status))
    return workers.exit_code


class Workers:
    """The parent's side: the children by pid, the restarts lately, whether it is stopping."""

    def __init__(
        self, target: Callable[[int], int], early: EarlySignals = EARLY, on_stop: Callable[[], None] | None = None
    ) -> None:
        self.target = target
        self.early = early
        self.on_stop = on_stop
        self.parent = os.getpid()
        self.children: dict[int, int] = {}  # pid -> worker index
        self.stopping = False
        self.restarts: collections.deque[float] = collections.deque()
        self.exit_code = 0

    def spawn(self, index: int) -> None:
        # Block the forwarded signals across fork(), so a signal cannot reach the parent
        # between fork() and the bookkeeping below and miss the new child.
        signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
        try:
            pid = os.fork()
            if pid == 0:
                run_child(index, self.target, self.parent, self.early)
            self.children[pid] = index
            logger.info("started worker %d (pid %d)", index, pid)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)

    def signal_all(self, signum: int) -> None:
        for pid in list(self.children):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def stop_all(self) -> None:
        if not self.stopping and self.on_stop is not None:
            self.on_stop()
        self.stopping = True
        self.signal_all(signal.SIGTERM)

    def on_signal(self, signum: int, frame: object) -> None:
        if signum == signal.SIGHUP:
            self.signal_all(signal.SIGHUP)
            return
        if not self.stopping:
            logger.info("%s: stopping %d workers", signal.Signals(signum).name, len(self.children))
        self.stop_all()

    def exited(self, pid: int, code: int) -> None:
        """A child ended with `code`: note it, stop everything, or start its index again."""
        index = self.children.pop(pid, None)
        if index is None:
            return
        if self.stopping:
            if code != 0:
                logger.warning("worker %d (pid %d) exited with %d", index, pid, code)
                self.exit_code = 1
            return
        if code == EXIT_CONFIG:
            logger.error("worker %d (pid %d) failed its configuration; stopping", index, pid)
            self.exit_code = 1
            self.stop_all()
            return
        now = time.monotonic()
        while self.restarts and now - self.restarts[0] > RESTART_WINDOW:
            self.restarts.popleft()
        if len(self.restarts) >= MAX_RESTARTS:
            logger.error("workers keep crashing (%d restarts in %.0f s); stopping", len(self.restarts), RESTART_WINDOW)
            self.exit_code = 1
            self.stop_all()
            return
        self.restarts.append(now)
        logger.error("worker %d (pid %d) exited with %d; restarting it", index, pid, code)
        self.spawn(index)


def run_child(index: int, target: Callable[[int], int], parent: int, early: EarlySignals) -> NoReturn:
    """In a freshly forked worker: run `target(index)`, then leave the process with its code."""
    code = 1
    try:
        # The signals stay blocked (spawn) until noted by the worker's own `early`, which
        # its event loop takes over: a SIGTERM at any moment of its start-up stops it cleanly.
        early.reset()
        early.install()
        die_with_parent(parent)
        if os.getppid() != parent:  # it died before prctl() took effect
            raise SystemExit(0)
        code = target(index)
    except KeyboardInterrupt:
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        logger.exception("worker %d failed", index)
    finally:
        logging.shutdown()
        os._exit(code)
