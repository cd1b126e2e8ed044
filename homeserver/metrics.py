"""Prometheus metrics: requests by handler and status, login outcomes, backend calls, sessions."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

if TYPE_CHECKING:
    from homeserver.delegation.sweep_report import SweepReport

logger = logging.getLogger(__name__)

# The directory sweep's counts, by the metric's `action` label.
SWEEP_ACTIONS = ("provisioned", "deactivated", "reactivated", "unchanged", "sessions_ended", "failed")

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
            "Logins (password and login token) by outcome: success, unknown_user, bad_password, bad_token, locked, "
            "deactivated, rate_limited, bad_request, second_factor_required, error.",
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
            "Sessions ended, by reason: logout, logout_all, device_deleted, revoked, user_removed, replaced, "
            "password_changed, account_replaced, credential_changed.",
            ["reason"],
            registry=self.registry,
        )
        self.ratelimit_fallbacks = Counter(
            "homeserver_ratelimit_fallbacks",
            "Login limit checks answered by this process's own buckets because the shared store could not.",
            registry=self.registry,
        )
        self.synapse_calls = Counter(
            "homeserver_synapse_calls",
            "Calls to Synapse's /_synapse/mas/ API (delegation), by call and outcome: ok, not_found, refused, "
            "unreachable.",
            ["call", "outcome"],
            registry=self.registry,
        )
        self.synapse_latency = Histogram(
            "homeserver_synapse_call_duration_seconds",
            "Time a call to Synapse's /_synapse/mas/ API took, by call.",
            ["call"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.resyncs_pending = Gauge(
            "homeserver_delegation_resyncs_pending",
            "Users whose sign-outs Synapse has not heard of yet (it was away), as this process last saw.",
            registry=self.registry,
        )
        self.second_factors = Counter(
            "homeserver_second_factor_checks",
            "Second steps of browser sign-ins ([mfa]) by factor (totp, recovery, webauthn) and outcome: success, "
            "failure (a wrong, replayed or refused code or passkey; over the wrong-code limit included).",
            ["kind", "outcome"],
            registry=self.registry,
        )
        self.sweeps = Counter(
            "homeserver_directory_sweeps",
            "Sweeps of the whole user store (delegation) this process ran, by outcome: done, guarded (the guard "
            "deactivated no one), failed (stopped by an error).",
            ["outcome"],
            registry=self.registry,
        )
        self.sweep_users = Counter(
            "homeserver_directory_sweep_users",
            "Users the directory sweeps acted on, by action: provisioned, deactivated, reactivated, unchanged, "
            "sessions_ended, failed.",
            ["action"],
            registry=self.registry,
        )
        self.sweep_seconds = Gauge(
            "homeserver_directory_sweep_seconds",
            "How long the last directory sweep this process ran took.",
            registry=self.registry,
        )
        self.sweep_guard = Gauge(
            "homeserver_directory_sweep_guard",
            "1 when the last directory sweep this process ran deactivated no one because of the guard, by "
            "reason: incomplete (the user store could not be read whole), shrunk (fewer than half of the users "
            "of the previous sweep); 0 otherwise.",
            ["reason"],
            registry=self.registry,
        )
        # Label children are looked up once per key: labels() costs more than inc().
        self._request_children: dict[tuple[type, str, int], tuple[Any, Any]] = {}
        self._backend_children: dict[tuple[str, str], tuple[Any, Any]] = {}

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

    def observe_backend(self, backend: str, operation: str, seconds: float, failed: bool) -> None:
        """Time one user-backend call (homeserver.users, the one door to the backend)."""
        children = self._backend_children.get((backend, operation))
        if children is None:
            children = (
                self.backend_latency.labels(backend, operation),
                self.backend_errors.labels(backend, operation),
            )
            self._backend_children[(backend, operation)] = children
        children[0].observe(seconds)
        if failed:
            children[1].inc()

    def observe_login(self, outcome: str) -> None:
        self.logins.labels(outcome).inc()

    def observe_second_factor(self, kind: str, passed: bool) -> None:
        self.second_factors.labels(kind, "success" if passed else "failure").inc()

    def observe_ratelimit_fallback(self) -> None:
        self.ratelimit_fallbacks.inc()

    def observe_sessions_opened(self) -> None:
        self.sessions_opened.inc()

    def observe_sessions_ended(self, reason: str, count: int) -> None:
        self.sessions_ended.labels(reason).inc(count)

    def observe_synapse(self, call: str, outcome: str, seconds: float) -> None:
        self.synapse_calls.labels(call, outcome).inc()
        self.synapse_latency.labels(call).observe(seconds)

    def observe_resyncs_pending(self, count: int) -> None:
        self.resyncs_pending.set(count)

    def observe_sweep(self, report: SweepReport) -> None:
        """One directory sweep that ran to its end (homeserver.delegation.sweep)."""
        self.sweeps.labels("guarded" if report.guard else "done").inc()
        for action in SWEEP_ACTIONS:
            self.sweep_users.labels(action).inc(getattr(report, action))
        self.sweep_seconds.set(report.seconds)
        for reason in ("incomplete", "shrunk"):
            self.sweep_guard.labels(reason).set(1 if report.guard == reason else 0)

    def observe_sweep_failed(self) -> None:
        self.sweeps.labels("failed").inc()

    def render(self, accept: str | None) -> tuple[bytes, str]:
        """Return the exposition body and its content type, honouring OpenMetrics in Accept."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type
