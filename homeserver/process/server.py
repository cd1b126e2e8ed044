"""Run the HTTP server: one process or N workers, graceful shutdown on SIGTERM/SIGINT, reload on SIGHUP."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
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
from homeserver.process.httpserver import Server
from homeserver.process.listen import Listeners, bind_listeners
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
    server_cfg = config.section("server")
    processes = server_cfg["processes"]
    # Warnings of files others may read wait until start-up succeeded: a failed one is one line.
    secret_file.hold_warnings()
    # A bad [delegation] section (a short secret, an unreadable secret file) is one line, before anything starts.
    load_delegation_settings(config)
    # Bind first: a taken port or a bad host stops start-up with one line.
    listeners = bind_listeners(config)
    # With no base_url configured, the well-known and the support page name the port
    # actually listened on (--port, or port 0's pick), before any fork.
    config.follow_listener(listeners.main[0].getsockname()[1])
    if processes == 1:
        run_event_loop(serve(config, listeners), server_cfg["event_loop"])
        return 0
    # Load the users once here, before the secret and the fork, so a broken store fails
    # start-up cleanly as with one process. The probe's connections are closed before
    # the fork: each worker opens its own.
    asyncio.run(probe_backend(config))
    log_listening(listeners.main, f"{processes} worker processes")
    # Make (or check) the signing secret once, so the workers do not race to create it.
    load_secret(config)
    secret_file.release_warnings()

    parent = os.getpid()

    def worker(index: int) -> int:
        try:
            # Each worker makes its own loop after the fork.
            run_event_loop(serve(config, listeners, worker=index, parent=parent), server_cfg["event_loop"])
        except ConfigError as exc:
            logger.error("worker %d: %s", index, exc)
            return EXIT_CONFIG
        return 0

    code = run_workers(processes, worker)
    logger.info("all workers stopped")
    return code


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


async def serve(config: Config, listeners: Listeners, worker: int | None = None, parent: int | None = None) -> None:
    """Start the backend (in this process: after any fork), listen, and stop cleanly on a signal.

    A worker (`worker` its index) also stops when its `parent` process is gone.
    """
    # Load the users before anything else, so a broken store fails start-up cleanly.
    backend, session_store = await start_stores(config)
    hs = build_homeserver(config, backend, session_store)
    await hs.start()
    sweeper = asyncio.ensure_future(
        hs.devices.sweep_forever(hs.users, config.get("sessions", "sweep_interval"))
    )
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
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # The log lines this loop writes go out together, once per turn (homeserver.logs).
    gather_writes(loop)
    # The signals are handled before the server says it serves: a SIGHUP sent as soon as
    # that line shows reloads.
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, lambda: asyncio.ensure_future(reload_users(hs)))
    orphan_watch = asyncio.ensure_future(watch_parent(parent, stop.set)) if parent is not None else None
    if worker is None:
        log_listening(listeners.main, f"backend {hs.backend.name}")
    else:
        logger.info("worker %d (pid %d) serving (backend %s)", worker, os.getpid(), hs.backend.name)
    server.add_sockets(listeners.main)
    metrics_server = start_metrics_server(hs, listeners.metrics.get(worker or 0))
    secret_file.release_warnings()
    await stop.wait()
    if orphan_watch is not None:
        orphan_watch.cancel()
    # A second SIGTERM/SIGINT (Ctrl-C again) cuts the drain short.
    hurry = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, hurry.set)
    sweeper.cancel()
    try:
        await shutdown(hs, server, hs.inflight, server_cfg["drain_timeout"], metrics_server, hurry)
    finally:
        gather_writes(None)


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
