"""Operations endpoints: liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import logging
import os

from homeserver.errors import MatrixError
from homeserver.handlers.base import BaseHandler


class LivenessHandler(BaseHandler):
    """The process serves requests; no store is probed (a store outage is no reason to restart)."""

    def get(self) -> None:
        # The pid tells which worker answered when [server] processes > 1.
        self.write_json({"status": "ok", "pid": os.getpid()})


class ReadinessHandler(BaseHandler):
    """Ready for traffic: the store answers and no shutdown is under way; else 503."""

    access_log_level: int | None = None

    async def get(self) -> None:
        if self.hs.inflight.draining:
            # Expected during every drain: answered here rather than raised, so it is not
            # logged as a server error, and its access line is INFO, not ERROR.
            self.access_log_level = logging.INFO
            self.set_header("Retry-After", "5")
            self.write_json(MatrixError(503, "M_UNKNOWN", "Shutting down").body(), 503)
            return
        await self.hs.backend.check_health()
        self.write_json({"status": "ready"})


class MetricsHandler(BaseHandler):
    """Prometheus exposition of this process's metrics."""

    def get(self) -> None:
        body, content_type = self.hs.metrics.render(self.request.headers.get("Accept"))
        self.set_header("Content-Type", content_type)
        self.finish(body)


ROUTES = [
    (r"/health", LivenessHandler),
    (r"/health/ready", ReadinessHandler),
]

METRICS_ROUTES = [
    (r"/metrics", MetricsHandler),
]
