"""Operations endpoints: liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import asyncio
import logging
import os

from homeserver.errors import shutting_down, unrecognized
from homeserver.handlers.base import BaseHandler


class LivenessHandler(BaseHandler):
    """The process serves requests; no store is probed (a store outage is no reason to restart)."""

    def get(self) -> None:
        # The pid tells which worker answered when [server] processes > 1.
        self.write_json({"status": "ok", "pid": os.getpid()})


class ReadinessHandler(BaseHandler):
    """Ready for traffic: both stores answer and no shutdown is under way; else 503 naming what is not."""

    async def get(self) -> None:
        if self.hs.inflight.draining:
            # Expected during every drain: answered here rather than raised, so it is not
            # logged as a server error, and its access line is INFO, not ERROR.
            self.access_log_level = logging.INFO
            self.answer_problem(shutting_down(retry_after=5))
            return
        # Both stores, at once: every authenticated request needs the session store too.
        await asyncio.gather(self.hs.users.check_health(), self.hs.sessions.store.check_health())
        self.write_json({"status": "ready"})


class MetricsHandler(BaseHandler):
    """Prometheus exposition of this process's metrics."""

    def get(self) -> None:
        if self.hs.metrics is None:  # only routed when metrics are on
            raise unrecognized()
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
