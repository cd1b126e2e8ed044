"""Application wiring: the HomeServer context, precomputed documents and make_app()."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import tornado.web

import backends
from backends.base import UserBackend
from homeserver.config import Config
from homeserver.drain import InFlight
from homeserver.handlers import account, discovery, health, login, profile
from homeserver.handlers.base import NotFoundHandler, encode_json
from homeserver.logs import log_request
from homeserver.metrics import InstrumentedBackend, Metrics
from homeserver.passwords import PasswordChecker
from homeserver.proxies import ClientAddress
from homeserver.ratelimit import LoginLimits
from homeserver.tokens import TokenIssuer, load_secret

logger = logging.getLogger(__name__)

ROOM_VERSIONS = {str(v): "stable" for v in range(1, 12)}


@dataclass(frozen=True)
class Documents:
    """The static response bodies, serialised once at start-up."""

    well_known_client: bytes
    well_known_support: bytes
    versions: bytes
    login_flows: bytes
    capabilities: bytes

    @classmethod
    def from_config(cls, config: Config) -> "Documents":
        server = config.section("server")
        support = config.section("support")
        base_url = server["base_url"].rstrip("/")
        client = {"m.homeserver": {"base_url": server["base_url"]}}
        if server["identity_server_url"]:
            client["m.identity_server"] = {"base_url": server["identity_server_url"]}
        disabled = {"enabled": False}  # the service changes no account
        return cls(
            well_known_client=encode_json(client),
            well_known_support=encode_json(
                {
                    "contacts": [
                        {
                            "email_address": support["email_address"],
                            "matrix_id": support["matrix_id"],
                            "role": support["role"],
                        }
                    ],
                    "support_page": base_url + "/support.html",
                }
            ),
            versions=encode_json({"versions": ["v1.12"]}),
            login_flows=encode_json({"flows": [{"type": "m.login.password"}]}),
            capabilities=encode_json(
                {
                    "capabilities": {
                        "m.change_password": disabled,
                        "m.set_displayname": disabled,
                        "m.set_avatar_url": disabled,
                        "m.3pid_changes": disabled,
                        "m.get_login_token": disabled,
                        "m.room_versions": {"default": "10", "available": ROOM_VERSIONS},
                    }
                }
            ),
        )


@dataclass
class HomeServer:
    """What handlers need: config, the user backend, tokens, the password pool, documents."""

    config: Config
    backend: UserBackend
    tokens: TokenIssuer
    checker: PasswordChecker
    documents: Documents
    limits: LoginLimits = field(default_factory=LoginLimits)
    metrics: Metrics | None = None

    @property
    def server_name(self) -> str:
        return self.config.get("server", "server_name")

    @property
    def max_body_size(self) -> int:
        return self.config.get("server", "max_body_size")

    async def close(self) -> None:
        await self.backend.close()
        self.checker.close()


def create_backend(config: Config) -> UserBackend:
    name = config.get("backend", "type")
    options = dict(config.sections.get(f"backend.{name}", {}))
    # Sub-tables such as [backend.ldap.attributes] arrive as nested dicts.
    prefix = f"backend.{name}."
    for section, values in config.sections.items():
        if section.startswith(prefix):
            options[section[len(prefix):]] = dict(values)
    return backends.create_backend(name, options, config_dir=config.config_dir)


def build_homeserver(config: Config, backend: UserBackend | None = None) -> HomeServer:
    """Assemble the context; the backend is started separately (`await backend.start()`)."""
    backend = backend if backend is not None else create_backend(config)
    metrics = Metrics() if config.get("metrics", "enabled") else None
    if metrics is not None:
        backend = InstrumentedBackend(backend, metrics)
    return HomeServer(
        config=config,
        backend=backend,
        tokens=TokenIssuer(load_secret(config), config.get("auth", "token_lifetime")),
        checker=PasswordChecker(
            config.get("auth", "bcrypt_workers"), config.get("auth", "max_pending_logins")
        ),
        documents=Documents.from_config(config),
        limits=LoginLimits.from_config(config.section("rate_limit")),
        metrics=metrics,
    )


ROUTES = discovery.ROUTES + login.ROUTES + profile.ROUTES + account.ROUTES + health.ROUTES


def make_app(hs: HomeServer, inflight: InFlight | None = None) -> tornado.web.Application:
    """The client API; /metrics too when metrics are on and have no port of their own."""
    metrics = hs.metrics
    routes = list(ROUTES)
    if metrics is not None and not hs.config.get("metrics", "port"):
        routes += health.METRICS_ROUTES

    def log_function(handler: tornado.web.RequestHandler) -> None:
        log_request(handler)
        if metrics is not None:
            metrics.observe_request(handler)

    return tornado.web.Application(
        routes,
        default_handler_class=NotFoundHandler,
        log_function=log_function,
        homeserver=hs,
        metrics=metrics,
        inflight=inflight if inflight is not None else InFlight(),
        client_address=ClientAddress(hs.config.get("server", "trusted_proxies")),
    )


def make_metrics_app(hs: HomeServer) -> tornado.web.Application:
    """/metrics alone, for `[metrics] port`: keeps it off the public listener."""
    return tornado.web.Application(
        health.METRICS_ROUTES,
        default_handler_class=NotFoundHandler,
        log_function=lambda handler: None,
        homeserver=hs,
        metrics=hs.metrics,
    )
