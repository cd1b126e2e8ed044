"""The requests in flight, so a shutdown can let them finish before closing connections."""

from __future__ import annotations

import asyncio
import time
from typing import Any


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
