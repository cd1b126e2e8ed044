"""Run the HTTP server: one process or N workers, graceful shutdown on SIGTERM/SIGINT, reload on SIGHUP."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
from collections.abc import Coroutine
from typing import Any

from tornado.httpserver import HTTPServer

from backends import secret_file
from homeserver.app import make_app, make_metrics_app
from homeserver.config import Config
from homeserver.context import HomeServer, build_homeserver, open_stores, start_stores
from homeserver.delegation import load_delegation_settings
from homeserver.errors import ConfigError
from homeserver.inflight import InFlight
from homeserver.logs import gather_writes
from homeserver.process.early_signals import EARLY, EarlySignals
from homeserver.process.httpserver import Server
from homeserver.process.listen import Listeners, bind_listeners
from homeserver.process.signals import LoopSignals
from homeserver.process.workers import EXIT_CONFIG, run_workers, watch_parent
from homeserver.tokens import load_secret

logger = logging.getLogger(__name__)

# Bytes read from a connection at a time (and the largest body piece a handler is given).
READ_CHUNK = 16 * 1024


def run_event_loop(main: Coroutine[Any, Any, None], choice: str = "auto") -> None:
    """Run `main` on uvloop when chosen or (for "auto") installed, else on asyncio's loop.

    uvloop serves about 10 % more requests per core here (docs/performance.md).
    """
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                main.close()
                raise ConfigError("server.event_loop: uvloop is not installed (pip install uvloop)") from None
        else:
            logger.debug("event loop: uvloop %s", uvloop.__version__)
            uvloop.run(main)
            return
    asyncio.run(main)


def run(config: Config) -> int:
    """Serve until stopped; with `[server] processes` > 1, as that many forked workers."""
    # Stop and reload signals are noted (since run.py's first lines, or from here on when
    # called otherwise), not left to whatever the process inherited, until an event loop
    # takes them (homeserver.process.early_signals, signals).
    early = EARLY
    early.install()
    server_cfg = config.section("server")
    processes = server_cfg["processes"]
    # Warnings of files others may read wait until start-up succeeded: a failed one is one line.
    secret_file.hold_warnings()
    # A bad [delegation] section (a short secret, an unreadable secret file) is one line, before anything starts.
    load_delegation_settings(config)
    if early.stop_requested:  # stopped while the program was loading: not even the port is taken
        logger.info("shutting down: %s during start-up, nothing served", early.stop_name)
        return 0
    # Bind first: a taken port or a bad host stops start-up with one line.
    listeners = bind_listeners(config)
    # With no base_url configured, the well-known and the support page name the port
    # actually listened on (--port, or port 0's pick), before any fork.
    config.follow_listener(listeners.main[0].getsockname()[1])
    if processes == 1:
        run_event_loop(serve(config, listeners, early), server_cfg["event_loop"])
        return 0
    # Load the users once here, before the secret and the fork, so a broken store fails
    # start-up cleanly as with one process. The probe's connections are closed before
    # the fork: each worker opens its own.
    if not asyncio.run(probe_unless_stopped(config, early)):
        listeners.close()
        return 0
    log_listening(listeners.main, f"{processes} worker processes")
    # Make (or check) the signing secret once, so the workers do not race to create it.
    load_secret(config)
    secret_file.release_warnings()

    parent = os.getpid()

    def worker(index: int) -> int:
        try:
            # Each worker makes its own loop after the fork.
            run_event_loop(serve(config, listeners, early, worker=index, parent=parent), server_cfg["event_loop"])
        except ConfigError as exc:
            logger.error("worker %d: %s", index, exc)
            return EXIT_CONFIG
        return 0

    # Once stopping, the parent lets go of the port: only the draining workers hold it, and
    # each lets go as its drain starts, so a new server can bind it at once (kill; start).
    code = run_workers(processes, worker, early, on_stop=listeners.close)
    logger.info("all workers stopped")
    return code


async def probe_unless_stopped(config: Config, early: EarlySignals) -> bool:
    """The parent's probe of the stores (probe_backend); False when a stop came first."""
    loop = asyncio.get_running_loop()
    signals = LoopSignals(early)
    signals.install(loop)
    try:
        probed, _ = await signals.unless_stopped(probe_backend(config))
    finally:
        signals.uninstall(loop)
    if not probed:
        logger.info("shutting down: %s during start-up, nothing served", signals.signal_name)
    return probed


async def probe_backend(config: Config) -> None:
    """Start the user backend and the session store, and close them again.

    A bad store fails here, in the parent, and the session store's schema is created or
    migrated once, before the workers start.
    """
    async with open_stores(config):
        pass  # started, and closed again: each worker opens its own


def log_listening(sockets: list[socket.socket], what: str) -> None:
    addresses = sorted({f"{s.getsockname()[0]}:{s.getsockname()[1]}" for s in sockets})
    logger.info("listening on %s (%s)", ", ".join(addresses), what)


async def start_parts(config: Config) -> HomeServer:
    """The user store and the session store started and the server's parts built; what was
    opened is closed again when this fails or is cancelled (a stop during start-up)."""
    # The users first, so a broken store fails start-up cleanly.
    backend, session_store = await start_stores(config)
    try:
        return build_homeserver(config, backend, session_store)
    except BaseException:
        await session_store.close()
        await backend.close()
        raise


async def serve(
    config: Config, listeners: Listeners, early: EarlySignals, worker: int | None = None, parent: int | None = None
) -> None:
    """Start the stores (in this process: after any fork), listen, and stop cleanly on a signal.

    The loop takes the signals before start-up begins: a SIGTERM during start-up ends it
    there. A worker (`worker` its index) also stops when its `parent` process is gone.
    """
    loop = asyncio.get_running_loop()
    signals = LoopSignals(early)
    signals.install(loop)
    # The log lines this loop writes go out together, once per turn (homeserver.logs).
    gather_writes(loop)
    orphan_watch = (
        asyncio.ensure_future(watch_parent(parent, lambda: signals.request_stop("the parent gone")))
        if parent is not None else None
    )
    try:
        _, hs = await signals.unless_stopped(start_parts(config))
        if hs is None:
            logger.info("shutting down: %s during start-up, nothing served", signals.signal_name)
            listeners.close()
        else:
            await serve_until_stopped(hs, listeners, signals, worker)
    finally:
        if orphan_watch is not None:
            orphan_watch.cancel()
        signals.uninstall(loop)
        gather_writes(None)


async def serve_until_stopped(hs: HomeServer, listeners: Listeners, signals: LoopSignals, worker: int | None) -> None:
    config = hs.config
    await hs.start()
    # One sweep: the directory sweep with delegation (it ends leavers' sessions too), else the sessions'.
    sweeper = hs.start_sweeping(config.get("sessions", "sweep_interval"))
    if hs.delegation is not None:
        # Synapse may start after us: a warning and retries, never a crash.
        hs.delegation.start()
    server_cfg = config.section("server")
    # Handlers that take a body stream it and answer 413 themselves; this bound only caps
    # what any other handler buffers before it is thrown away (413 too, and a head past
    # Tornado's 64 KiB is 431: homeserver.process.httpserver).
    limit = max(4 * server_cfg["max_body_size"], 1 << 20)
    server = Server(
        make_app(hs),
        max_body_size=limit,
        named_body_size=server_cfg["max_body_size"],
        max_buffer_size=limit,
        # Idle keep-alive connections, and clients sending headers slowly, are dropped;
        # so are bodies that trickle in: many slow connections cannot pin the server.
        idle_connection_timeout=server_cfg["idle_timeout"],
        body_timeout=server_cfg["body_timeout"],
        # Tornado zeroes a fresh buffer of this size for every read from a socket (two a
        # request); its default of 64 KiB costs more than a whole header block needs.
        chunk_size=READ_CHUNK,
    )
    settle_gc()
    # SIGHUP reloads from here on (once now if one came during start-up), before the server
    # says it serves: a SIGHUP sent as soon as that line shows reloads.
    reloads: set[asyncio.Task[None]] = set()

    def reload() -> None:
        task = asyncio.ensure_future(reload_users(hs))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    signals.reloads_from_now(reload)
    if worker is None:
        log_listening(listeners.main, f"backend {hs.backend.name}")
    else:
        logger.info("worker %d (pid %d) serving (backend %s)", worker, os.getpid(), hs.backend.name)
    server.add_sockets(listeners.main)
    metrics_server = start_metrics_server(hs, listeners.metrics.get(worker or 0))
    secret_file.release_warnings()
    await signals.stop.wait()
    sweeper.cancel()  # now, so another process may sweep; hs.close() waits for it to let go of its lease
    # A second SIGTERM/SIGINT (Ctrl-C again) cuts the drain short.
    await shutdown(hs, server, hs.inflight, server_cfg["drain_timeout"], metrics_server, signals.hurry)


# Container objects allocated (less those freed) between two young-generation collections;
# CPython's default is 700.
GC_YOUNG_THRESHOLD = 50_000


def settle_gc() -> None:
    """Once started: keep the cycle collector off what start-up built, and let it run less often.

    Everything loaded so far (modules, the users file, the parts of the server) lives as
    long as the process, so `gc.freeze()` takes it out of every later collection. A
    request makes almost no reference cycles (Tornado breaks its own), so the young
    generation is collected after 50,000 new objects instead of 700: the same garbage
    is found, at about a fifth of the collector's CPU per request (docs/performance.md).
    """
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


async def reload_users(hs: HomeServer) -> None:
    """SIGHUP: read the user store again where the backend keeps a copy (the users file)."""
    if not await hs.backend.reload():
        logger.info("SIGHUP: nothing reloaded (backend %s)", hs.backend.name)


def start_metrics_server(hs: HomeServer, sockets: list[socket.socket] | None) -> HTTPServer | None:
    """Serve /metrics on this worker's `[metrics] port` (+ its index) sockets, when bound."""
    if hs.metrics is None or not sockets:
        return None
    server = HTTPServer(make_metrics_app(hs), idle_connection_timeout=60)
    server.add_sockets(sockets)
    for address in sorted({s.getsockname()[:2] for s in sockets}):
        logger.info("metrics on %s:%d/metrics", *address)
    return server


async def shutdown(
    hs: HomeServer,
    server: HTTPServer,
    inflight: InFlight,
    drain_timeout: float,
    metrics_server: HTTPServer | None,
    hurry: asyncio.Event | None = None,
) -> None:
    """Stop accepting, let in-flight requests finish, close connections, the backend and the pool."""
    logger.info("shutting down: %d requests in flight, waiting up to %.1f s", len(inflight), drain_timeout)
    server.stop()  # new connections are refused from here on
    inflight.draining = True  # readiness answers 503; responses carry Connection: close
    if not await inflight.wait_idle(drain_timeout, hurry):
        logger.warning("%d requests still running; answering them 503", len(inflight))
        inflight.answer_all_unavailable()
    # Close what is left: idle keep-alive connections (and requests past the deadline).
    await server.close_all_connections()
    if metrics_server is not None:
        metrics_server.stop()
        await metrics_server.close_all_connections()
    await hs.close()
    logger.info("stopped")
