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


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


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


def run_workers(count: int, target: Callable[[int], int]) -> int:
    """Fork `count` children running `target(index)`; return 0 when all stopped cleanly.

    Must be called before any thread or event loop exists in this process: children are
    plain forks. SIGTERM or SIGINT to this process is forwarded as SIGTERM so each worker
    drains its requests; SIGHUP is forwarded as is (reload the users file). A worker that
    dies on its own is restarted, within limits.
    """
    children: dict[int, int] = {}
    parent = os.getpid()
    stopping = False
    restarts: collections.deque[float] = collections.deque()

    def spawn(index: int) -> None:
        # Block the forwarded signals across fork(), so a signal cannot reach the parent
        # between fork() and the bookkeeping below and miss the new child.
        signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
        try:
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    # Until the worker's event loop takes over the signals, SIGTERM just
                    # ends it: nothing is in flight yet, so that is a clean stop.
                    signal.signal(signal.SIGTERM, _exit_cleanly)
                    signal.signal(signal.SIGINT, signal.default_int_handler)
                    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until the worker handles it
                    die_with_parent(parent)
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
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
            children[pid] = index
            logger.info("started worker %d (pid %d)", index, pid)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)

    def stop_all() -> None:
        nonlocal stopping
        stopping = True
        for pid in list(children):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def on_signal(signum: int, frame: object) -> None:
        if signum == signal.SIGHUP:
            for pid in list(children):
                try:
                    os.kill(pid, signal.SIGHUP)
                except ProcessLookupError:
                    pass
            return
        if not stopping:
            logger.info("%s: stopping %d workers", signal.Signals(signum).name, len(children))
        stop_all()

    for sig in FORWARDED:
        signal.signal(sig, on_signal)

    exit_code = 0
    for index in range(count):
        spawn(index)
    while children:
        try:
            pid, status = os.wait()  # a signal handler runs, then the wait resumes (PEP 475)
        except ChildProcessError:
            break
        if pid not in children:
            continue
        index = children.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        if stopping:
            if code != 0:
                logger.warning("worker %d (pid %d) exited with %d", index, pid, code)
                exit_code = 1
            continue
        if code == EXIT_CONFIG:
            logger.error("worker %d (pid %d) failed its configuration; stopping", index, pid)
            exit_code = 1
            stop_all()
            continue
        now = time.monotonic()
        while restarts and now - restarts[0] > RESTART_WINDOW:
            restarts.popleft()
        if len(restarts) >= MAX_RESTARTS:
            logger.error("workers keep crashing (%d restarts in %.0f s); stopping", len(restarts), RESTART_WINDOW)
            exit_code = 1
            stop_all()
            continue
        restarts.append(now)
        logger.error("worker %d (pid %d) exited with %d; restarting it", index, pid, code)
        spawn(index)
    return exit_code
