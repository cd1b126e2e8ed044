"""Run N worker processes on one listening socket, restart crashed ones, stop them on a signal."""

from __future__ import annotations

import collections
import logging
import os
import signal
import time
from typing import Callable

logger = logging.getLogger(__name__)

# A worker that exits with this code (sysexits' EX_CONFIG) failed its configuration:
# restarting it cannot help, so the whole server stops.
EXIT_CONFIG = 78
# More crashes than this within the window stop the server instead of looping forever.
MAX_RESTARTS = 5
RESTART_WINDOW = 30.0
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


def run_workers(count: int, target: Callable[[int], int]) -> int:
    """Fork `count` children running `target(index)`; return 0 when all stopped cleanly.

    Must be called before any thread or event loop exists in this process: children are
    plain forks. SIGTERM or SIGINT to this process is forwarded as SIGTERM so each worker
    drains its requests; SIGHUP is forwarded as is (reload the users file). A worker that
    dies on its own is restarted, within limits.
    """
    children: dict[int, int] = {}
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
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
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
        index = children.pop(pid, None)
        if index is None:
            continue
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
