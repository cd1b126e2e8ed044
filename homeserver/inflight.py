"""The requests in flight (`hs.inflight`), so a shutdown can let them finish before closing connections
(homeserver.process.server: wait, then answer those left 503)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from homeserver.errors import MatrixError, shutting_down

logger = logging.getLogger(__name__)


class InFlight:
    """Handlers between their creation and their finish (or their client going away)."""

    def __init__(self) -> None:
        self.handlers: set[Any] = set()
        # Set once shutdown begins: readiness turns 503 and responses ask to close.
        self.draining = False

    def __len__(self) -> int:
        return len(self.handlers)

    def add(self, handler: Any) -> None:
        self.handlers.add(handler)

    def discard(self, handler: Any) -> None:
        self.handlers.discard(handler)

    async def wait_idle(self, timeout: float, abort: asyncio.Event | None = None, poll: float = 0.05) -> bool:
        """Wait until no request is in flight; False if `timeout` passed or `abort` was set first."""
        deadline = time.monotonic() + timeout
        while self.handlers:
            if time.monotonic() >= deadline or (abort is not None and abort.is_set()):
                return False
            await asyncio.sleep(poll)
        return True

    def answer_all_unavailable(self) -> int:
        """Answer every request still running with 503 and Retry-After; return how many.

        Better for a client than a connection reset: it knows to retry elsewhere. Without
        this, Tornado would answer 500 when the shutdown cancels the handler's task.
        """
        error = shutting_down()
        answered = 0
        for handler in list(self.handlers):
            if handler._finished:  # Tornado has no public flag for this
                continue
            try:
                handler.send_error(503, exc_info=(MatrixError, error, None))
                answered += 1
            except Exception:  # the client may be gone already; the close follows anyway
                logger.debug("could not answer a cut-off request", exc_info=True)
        return answered
