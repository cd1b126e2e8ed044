"""Run the HTTP server until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any, Coroutine

from tornado.httpserver import HTTPServer

from homeserver.app import build_homeserver, make_app
from homeserver.config import Config
from homeserver.errors import ConfigError

logger = logging.getLogger(__name__)


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
            logger.info("event loop: uvloop %s", uvloop.__version__)
            uvloop.run(main)
            return
    asyncio.run(main)


async def serve(config: Config) -> None:
    """Start the backend, listen, and stop cleanly on a signal."""
    hs = build_homeserver(config)
    await hs.backend.start()
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
