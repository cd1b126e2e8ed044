"""The server's parts, built once from the config: what every handler reaches through `self.hs`."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import backends
import backends.sessions
from backends.base import StoreUnavailable, UserBackend
from backends.sessions import SessionStore
from backends.sessions.browser import BrowserSessions
from homeserver.account_page import AccountPage
from homeserver.auth import Auth
from homeserver.config import Config
from homeserver.credentials import Credentials
from homeserver.delegation import Delegation, load_delegation_settings
from homeserver.devices import Devices
from homeserver.documents import Documents
from homeserver.login import LoginService
from homeserver.metrics import Metrics
from homeserver.oauth import OAuth, build_oauth
from homeserver.passwords import PasswordChecker
from homeserver.process.drain import InFlight
from homeserver.proxies import ClientAddress
from homeserver.ratelimit import LoginLimits
from homeserver.sessions import Sessions
from homeserver.tokens import TokenIssuer, load_secret
from homeserver.uia import UserInteractiveAuth
from homeserver.users import Users

logger = logging.getLogger(__name__)


@dataclass
class HomeServer:
    """Config, the user store, sessions, tokens and auth, the password pool, documents, limits, metrics;
    and the services the handlers call: auth, UIA, login, devices, the account page."""

    config: Config
    backend: UserBackend
    sessions: Sessions
    tokens: TokenIssuer
    checker: PasswordChecker
    documents: Documents
    limits: LoginLimits = field(default_factory=LoginLimits)
    metrics: Metrics | None = None
    # Requests in flight, so a graceful shutdown can wait for them (homeserver.process.drain).
    inflight: InFlight = field(default_factory=InFlight)
    # Resolves a request's client address (X-Forwarded-For only from trusted proxies).
    client_address: ClientAddress = field(default_factory=ClientAddress)
    # Fingerprints of the credential each session was opened with (homeserver.credentials).
    credentials: Credentials | None = None
    # The Synapse this server is the authentication service of; None when `[delegation]` is off.
    delegation: Delegation | None = None
    users: Users = field(init=False)
    # The account page's sign-ins, kept beside the sessions (backends.sessions.browser).
    pages: BrowserSessions = field(init=False)
    auth: Auth = field(init=False)
    uia: UserInteractiveAuth = field(init=False)
    login: LoginService = field(init=False)
    devices: Devices = field(init=False)
    # The OAuth 2.0 API (homeserver.oauth); None when `[oauth]` is off.
    oauth: OAuth | None = field(init=False)
    account_page: AccountPage = field(init=False)

    def __post_init__(self) -> None:
        self.users = Users(self.backend, self.metrics)
        if self.credentials is None:
            self.credentials = Credentials(
                self.tokens.secret,
                self.tokens.keys[1:],
                end_on_password_change=self.config.get("sessions", "end_on_password_change"),
            )
        self.uia = UserInteractiveAuth(self.tokens.secret, self.users, self.checker, self.limits, self.server_name)
        self.pages = self.sessions.store.browser_sessions()
        self.devices = Devices(self.sessions, self.uia, self.delegation, self.credentials, pages=self.pages)
        self.auth = Auth(
            self.tokens, self.sessions, self.users, self.server_name, self.credentials, end_stale=self.devices.end_stale
        )
        self.login = LoginService(
            users=self.users,
            tokens=self.tokens,
            checker=self.checker,
            sessions=self.sessions,
            server_name=self.server_name,
            limits=self.limits,
            metrics=self.metrics,
            credentials=self.credentials,
            delegation=self.delegation,
        )
        self.oauth = build_oauth(
            self.config, self.sessions.store, users=self.users, devices=self.devices, credentials=self.credentials,
            tokens=self.tokens, delegation=self.delegation,
        )
        if self.oauth is not None:
            # A logout of an OAuth access token ends its refresh token too (the whole device).
            self.devices.ends_device = self.oauth.ends_device
            # The first use of an access token is kept on its grant (the refresh rule reads it).
            self.sessions.first_use = self.oauth.first_use
        self.account_page = AccountPage(
            users=self.users,
            store=self.pages,
            login=self.login,
            credentials=self.credentials,
            delegation=self.delegation,
            server_name=self.server_name,
        )

        # A reloaded users file names the accounts that changed: their stale sessions end at once.
        self.backend.on_change = self._accounts_changed
        self._tasks: set[asyncio.Task[None]] = set()

    def _accounts_changed(self, changes: dict[str, list[str]]) -> None:
        task = asyncio.ensure_future(self._end_stale(changes))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _end_stale(self, changes: dict[str, list[str]]) -> None:
        try:
            await self.devices.check_changed(self.users, changes)
        except StoreUnavailable as exc:  # their next request (or the sweep) ends them instead
            logger.warning("sessions of changed accounts not ended yet: %s", exc)
        except Exception:
            logger.exception("ending the sessions of changed accounts failed")

    @property
    def server_name(self) -> str:
        return self.config.get("server", "server_name")

    @property
    def max_body_size(self) -> int:
        return self.config.get("server", "max_body_size")

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self.delegation is not None:
            await self.delegation.close()
        await self.backend.close()
        await self.sessions.close()
        self.checker.close()


def create_backend(config: Config) -> UserBackend:
    """Build (not start) the user backend `[backend] type` names, from its sections."""
    name = config.get("backend", "type")
    options = dict(config.sections.get(f"backend.{name}", {}))
    # Sub-tables such as [backend.ldap.attributes] arrive as nested dicts.
    prefix = f"backend.{name}."
    for section, values in config.sections.items():
        if section.startswith(prefix):
            options[section[len(prefix):]] = dict(values)
    return backends.create_backend(name, options, config_dir=config.config_dir)


def create_session_store(config: Config) -> SessionStore:
    """Build (not start) the session store `[sessions] store` names."""
    kind = config.get("sessions", "store")
    return backends.sessions.create_session_store(
        kind, dict(config.section(f"sessions.{kind}")), config_dir=config.config_dir
    )


def build_homeserver(
    config: Config, backend: UserBackend | None = None, session_store: SessionStore | None = None
) -> HomeServer:
    """Assemble the context; the backend and the session store are started separately (`start()`)."""
    backend = backend if backend is not None else create_backend(config)
    metrics = Metrics() if config.get("metrics", "enabled") else None
    session_store = session_store if session_store is not None else create_session_store(config)
    limits = LoginLimits.from_config(config.section("rate_limit"), shared=session_store.buckets())
    if metrics is not None:
        limits.on_fallback = metrics.observe_ratelimit_fallback
    sessions = Sessions(
        session_store,
        lifetime=config.get("auth", "token_lifetime"),
        touch_interval=config.get("sessions", "touch_interval"),
        metrics=metrics,
    )
    settings = load_delegation_settings(config)
    server_name = config.get("server", "server_name")
    delegation = (
        Delegation(settings, sessions, server_name, metrics=metrics, state=session_store.delegation())
        if settings else None
    )
    return HomeServer(
        config=config,
        delegation=delegation,
        backend=backend,
        sessions=sessions,
        tokens=TokenIssuer(
            load_secret(config),
            config.get("auth", "token_lifetime"),
            previous=config.get("auth", "previous_jwt_secrets"),
        ),
        checker=PasswordChecker(
            config.get("auth", "bcrypt_workers"),
            config.get("auth", "max_pending_logins"),
            config.get("auth", "bcrypt_rounds"),
        ),
        documents=Documents.from_config(config),
        limits=limits,
        metrics=metrics,
        client_address=ClientAddress(config.get("server", "trusted_proxies")),
    )
