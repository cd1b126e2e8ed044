"""Run the HTTP server until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal

from tornado.httpserver import HTTPServer

from homeserver.app import build_homeserver, create_backend, make_app
from homeserver.config import Config

logger = logging.getLogger(__name__)


async def serve(config: Config) -> None:
    """Start the backend, listen, and stop cleanly on a signal."""
    # Load the users before anything else, so a broken store fails start-up cleanly.
    backend = create_backend(config)
    await backend.start()
    hs = build_homeserver(config, backend)
    server_cfg = config.section("server")
    # The login handler streams its body and answers 413 itself; this bound only caps
    # what any other handler buffers before it is thrown away.
    limit = max(4 * server_cfg["max_body_size"], 1 << 20)
    server = HTTPServer(make_app(hs), max_body_size=limit, max_buffer_size=limit)
    server.listen(server_cfg["port"], server_cfg["host"])
    logger.info("listening on %s:%d (backend %s)", server_cfg["host"], server_cfg["port"], hs.backend.name)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    logger.info("shutting down")
    server.stop()
    await server.close_all_connections()
    await hs.close()
