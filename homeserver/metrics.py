"""Prometheus metrics: requests by handler and status, login outcomes, backend calls."""

from __future__ import annotations

import logging
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import choose_encoder

from backends.base import User, UserBackend

logger = logging.getLogger(__name__)

# Latency buckets from 1 ms (static documents) to 5 s (bcrypt under load, slow stores).
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Metrics:
    """The server's metrics, in a registry of their own (one per HomeServer, so tests stay apart)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "homeserver_http_requests",
            "HTTP requests answered, by handler class, method and status.",
            ["handler", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "homeserver_http_request_duration_seconds",
            "Time from the request's arrival to its response, by handler class.",
            ["handler"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.logins = Counter(
            "homeserver_logins",
            "Password logins by outcome: success, unknown_user, bad_password, rate_limited, bad_request, error.",
            ["outcome"],
            registry=self.registry,
        )
        self.backend_latency = Histogram(
            "homeserver_backend_request_duration_seconds",
            "Time the user backend took, by backend and operation.",
            ["backend", "operation"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.backend_errors = Counter(
            "homeserver_backend_errors",
            "User backend calls that failed (store unavailable or any other error).",
            ["backend", "operation"],
            registry=self.registry,
        )
        self.sessions_opened = Counter(
            "homeserver_sessions_opened",
            "Sessions opened (one per successful login).",
            registry=self.registry,
        )
        self.sessions_ended = Counter(
            "homeserver_sessions_ended",
            "Sessions ended, by reason: logout, logout_all, device_deleted, user_removed.",
            ["reason"],
            registry=self.registry,
        )
        self.ratelimit_fallbacks = Counter(
            "homeserver_ratelimit_fallbacks",
            "Login limit checks answered by this process's own buckets because the shared store could not.",
            registry=self.registry,
        )
        # Label children are looked up once per key: labels() costs more than inc().
        self._request_children: dict[tuple[type, str, int], tuple[Any, Any]] = {}

    def observe_request(self, handler: Any) -> None:
        """Count a finished request; Tornado calls this once per request (log_function)."""
        key = (type(handler), handler.request.method, handler.get_status())
        children = self._request_children.get(key)
        if children is None:
            name = key[0].__name__
            children = (self.requests.labels(name, key[1], str(key[2])), self.latency.labels(name))
            # Methods and statuses come from a small fixed set, but bound it anyway.
            if len(self._request_children) < 4096:
                self._request_children[key] = children
        children[0].inc()
        children[1].observe(handler.request.request_time())

    def observe_login(self, outcome: str) -> None:
        self.logins.labels(outcome).inc()

    def observe_ratelimit_fallback(self) -> None:
        self.ratelimit_fallbacks.inc()

    def observe_sessions_opened(self) -> None:
        self.sessions_opened.inc()

    def observe_sessions_ended(self, reason: str, count: int) -> None:
        self.sessions_ended.labels(reason).inc(count)

    def render(self, accept: str | None) -> tuple[bytes, str]:
        """Return the exposition body and its content type, honouring OpenMetrics in Accept."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type


class InstrumentedBackend(UserBackend):
    """Wrap a backend to time its calls and count its errors; everything else passes through."""

    def __init__(self, inner: UserBackend, metrics: Metrics) -> None:
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]
        self._latency = {
            op: metrics.backend_latency.labels(inner.name, op) for op in ("get_user", "verify_password", "check_health")
        }
        self._errors = {
            op: metrics.backend_errors.labels(inner.name, op) for op in ("get_user", "verify_password", "check_health")
        }

    @classmethod
    def from_config(cls, options: dict[str, Any], *, config_dir: str) -> "InstrumentedBackend":
        raise TypeError("InstrumentedBackend wraps a built backend; it is not configured directly")

    def _done(self, op: str, started: float, failed: bool) -> None:
        self._latency[op].observe(time.perf_counter() - started)
        if failed:
            self._errors[op].inc()

    async def start(self) -> None:
        await self.inner.start()

    async def get_user(self, name: str, *, case_insensitive: bool = False) -> User | None:
        started, failed = time.perf_counter(), True
        try:
            user = await self.inner.get_user(name, case_insensitive=case_insensitive)
            failed = False
            return user
        finally:
            self._done("get_user", started, failed)

    async def verify_password(self, user: User, password: str) -> bool | None:
        started, failed = time.perf_counter(), True
        try:
            verdict = await self.inner.verify_password(user, password)
            failed = False
            return verdict
        finally:
            self._done("verify_password", started, failed)

    async def check_health(self) -> None:
        started, failed = time.perf_counter(), True
        try:
            await self.inner.check_health()
            failed = False
        finally:
            self._done("check_health", started, failed)

    async def reload(self) -> bool:
        return await self.inner.reload()

    async def add_user(self, user: User, *, overwrite: bool = False) -> None:
        await self.inner.add_user(user, overwrite=overwrite)

    async def close(self) -> None:
        await self.inner.close()
