"""The one assembly: every part of the server built once from the config, in the order the parts
need each other, each given what it needs when it is built. The server (homeserver.process)
and every command (homeserver.cli) build their parts here; handlers reach them through `self.hs`.

Read `build_homeserver` top to bottom for the whole server. The configuration is read here,
once: a part takes its settings when it is built and never reads the config again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any

import backends
import backends.sessions
from backends.base import UserBackend
from backends.file import FileBackend
from backends.sessions import SessionStore
from backends.sessions.browser import BrowserSessions
from backends.sessions.oauth import OAuthStore
from homeserver.account_page import AccountPage
from homeserver.auth import Auth
from homeserver.config import Config
from homeserver.credentials import Credentials
from homeserver.delegation import Delegation, load_delegation_settings
from homeserver.delegation.sweep import DeactivatedAtSynapse, DirectorySweep
from homeserver.delegation.sweeper import Sweeper
from homeserver.devices import Devices
from homeserver.documents import Documents
from homeserver.inflight import InFlight
from homeserver.login import LoginService
from homeserver.metrics import Metrics
from homeserver.mfa.policy import SecondFactorPolicy
from homeserver.mfa.second_step import SecondStep
from homeserver.mfa.service import SecondFactors
from homeserver.oauth import OAuth, build_oauth
from homeserver.oauth.grants import Grants
from homeserver.passwords import PasswordChecker
from homeserver.proxies import ClientAddress
from homeserver.ratelimit import LoginLimits
from homeserver.refresh import LegacyRefresh
from homeserver.sessions import Sessions
from homeserver.sso import LoginTokens
from homeserver.synapse_passwords import load_pepper
from homeserver.tokens import TokenIssuer, load_secret
from homeserver.uia import UserInteractiveAuth
from homeserver.users import Users

logger = logging.getLogger(__name__)


@dataclass
class HomeServer:
    """The server's parts, as `build_homeserver` made them: what every handler reaches through `self.hs`."""

    # Read at start-up only (the listeners, the app's routes); every part took its settings when built.
    config: Config
    server_name: str
    base_url: str  # `[server] base_url`: where clients reach this server
    max_body_size: int
    metrics: Metrics | None
    # Requests in flight, so a graceful shutdown can wait for them (homeserver.inflight).
    inflight: InFlight
    # Resolves a request's client address (X-Forwarded-For only from trusted proxies).
    client_address: ClientAddress
    documents: Documents
    backend: UserBackend
    users: Users
    tokens: TokenIssuer
    # Fingerprints of the credential each session was opened with (homeserver.credentials).
    credentials: Credentials
    checker: PasswordChecker
    limits: LoginLimits
    uia: UserInteractiveAuth
    sessions: Sessions
    # The Synapse this server is the authentication service of; None when `[delegation]` is off.
    delegation: Delegation | None
    # The directory sweep (Synapse follows the user store) every `[delegation] sync_interval`
    # seconds; None when delegation or its sweeps are off (then `devices` sweeps sessions alone).
    sweeper: Sweeper | None
    # The account page's sign-ins, kept beside the sessions (backends.sessions.browser).
    browser_sessions: BrowserSessions
    devices: Devices
    auth: Auth
    login: LoginService
    # POST /refresh: the refresh tokens of password logins and of a Synapse moved here.
    refresh: LegacyRefresh
    # The OAuth 2.0 API (homeserver.oauth); None when `[oauth]` is off.
    oauth: OAuth | None
    # Second factors (homeserver.mfa) and who must pass a second step; None when `[mfa]` is off.
    second_factors: SecondFactors | None
    mfa_policy: SecondFactorPolicy | None
    # The browser sign-in's second step (pending sign-ins finished); None when `[mfa]` is off.
    second_step: SecondStep | None
    account_page: AccountPage
    # Legacy clients' browser sign-in (MSC3824): its login tokens; None unless `[mfa]` or
    # `[oauth]` is on (homeserver.sso).
    login_tokens: LoginTokens | None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, init=False, repr=False)

    async def start(self) -> None:
        """Begin the work the parts do on their own: the stale sessions of accounts the user
        store says changed end at once. (The serving process adds the sweep and Synapse's
        retries, homeserver.process.server.)"""
        self._background(self.devices.follow_changes(self.users))

    def sweep_forever(self, session_sweep_interval: float) -> Coroutine[Any, Any, None]:
        """The one sweep of the serving process: the directory sweep, which ends the sessions
        of users gone from the store too, or without it the session sweep alone."""
        if self.sweeper is not None:
            return self.sweeper.run_forever()
        return self.devices.sweep_forever(self.users, session_sweep_interval)

    def start_sweeping(self, session_sweep_interval: float) -> asyncio.Task[None]:
        """Run `sweep_forever` until cancelled; `stop` (and `close`, before it closes the stores)
        waits for it to end, so a sweep cut short gives the directory sweep's lease back."""
        return self._background(self.sweep_forever(session_sweep_interval))

    def _background(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def stop(self) -> None:
        """Stop what `start` began."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        """Stop, then close every part that holds a connection, a thread or a file, the stores last."""
        await self.stop()
        if self.delegation is not None:
            await self.delegation.close()
        await self.backend.close()
        await self.sessions.close()
        self.checker.close()


def build_homeserver(
    config: Config, backend: UserBackend | None = None, session_store: SessionStore | None = None
) -> HomeServer:
    """Every part of the server, each after those it needs, on its two stores (as
    `start_stores` gives them; built here, not started, when not given)."""
    backend = backend if backend is not None else create_backend(config)
    session_store = session_store if session_store is not None else create_session_store(config)
    server_name = config.get("server", "server_name")
    metrics = Metrics() if config.get("metrics", "enabled") else None

    # Who the users are and how they prove it: the user store's one door, the signing secret's
    # tokens, the fingerprints of each session's credential, the password pool, the limits.
    users = Users(backend, metrics)
    settings = config.section("auth")
    tokens = TokenIssuer(load_secret(config), settings["token_lifetime"], previous=settings["previous_jwt_secrets"])
    credentials = build_credentials(config, tokens.secret)
    checker = PasswordChecker(
        settings["bcrypt_workers"], settings["max_pending_logins"], settings["bcrypt_rounds"],
        synapse_pepper=load_pepper(config),
    )
    limits = LoginLimits.from_config(
        config.section("rate_limit"),
        shared=session_store.buckets(),
        on_fallback=metrics.observe_ratelimit_fallback if metrics is not None else None,
    )
    # Second factors (`[mfa]`): who must pass a second step at sign-in; off, nothing asks.
    second_factors = build_second_factors(config, session_store, metrics)
    mfa_policy = (
        SecondFactorPolicy(second_factors, required_for_all=config.get("mfa", "required") == "all")
        if second_factors is not None else None
    )
    second_factor = mfa_policy.needed if mfa_policy is not None else None
    uia = UserInteractiveAuth(
        tokens.secret, users, checker, limits, server_name, second_factor=second_factor,
        account_url=config.get("server", "base_url").rstrip("/") + "/account/",
    )

    # Sessions, and what follows every end of one: Synapse told (delegation), the account
    # page's browser sessions ended with all of a user's, a grant's refresh token with its
    # access token (grants: OAuth's, and those of logins that ask for one or moved from a Synapse).
    grants = session_store.oauth()
    sessions = build_sessions(config, session_store, metrics, grants=grants)
    delegation = build_delegation(config, sessions, metrics)
    browser_sessions = session_store.browser_sessions()
    devices = Devices(sessions, uia, delegation, credentials, browser_sessions=browser_sessions, grants=grants)
    # The directory sweep leaves alone the users an admin deactivated at Synapse (a move's list).
    sweeper = build_sweeper(delegation, users, devices, metrics, deactivated_at_synapse=session_store.imported())

    # The services the handlers call.
    auth = Auth(
        tokens, sessions, users, server_name, credentials, end_stale=devices.end_stale,
        imported_token_user=session_store.imported().token_user,
    )
    login_tokens = None
    if config.get("mfa", "enabled") or config.get("oauth", "enabled"):
        login_tokens = LoginTokens(
            session_store.login_tokens(), users=users, credentials=credentials, browser_sessions=browser_sessions
        )
    refresh = build_refresh(config, session_store, users=users, devices=devices, credentials=credentials,
                            tokens=tokens, delegation=delegation)
    login = LoginService(
        users=users, tokens=tokens, checker=checker, sessions=sessions, server_name=server_name, limits=limits,
        metrics=metrics, credentials=credentials, delegation=delegation, login_tokens=login_tokens,
        deactivated=session_store.imported().is_deactivated, refresh=refresh,
        second_factor=second_factor,
    )
    oauth = build_oauth(
        config, session_store, users=users, devices=devices, credentials=credentials, tokens=tokens,
        delegation=delegation,
    )
    account_page = AccountPage(
        users=users, browser_sessions=browser_sessions, login=login, credentials=credentials, delegation=delegation,
        server_name=server_name,
    )
    second_step = (
        SecondStep(second_factors, mfa_policy, account_page)
        if second_factors is not None and mfa_policy is not None else None
    )
    return HomeServer(
        config=config,
        server_name=server_name,
        base_url=config.get("server", "base_url"),
        max_body_size=config.get("server", "max_body_size"),
        metrics=metrics,
        inflight=InFlight(),
        client_address=ClientAddress(config.get("server", "trusted_proxies")),
        documents=Documents.from_config(config),
        backend=backend,
        users=users,
        tokens=tokens,
        credentials=credentials,
        checker=checker,
        limits=limits,
        uia=uia,
        sessions=sessions,
        delegation=delegation,
        sweeper=sweeper,
        browser_sessions=browser_sessions,
        devices=devices,
        auth=auth,
        login=login,
        refresh=refresh,
        oauth=oauth,
        account_page=account_page,
        login_tokens=login_tokens,
        second_factors=second_factors,
        mfa_policy=mfa_policy,
        second_step=second_step,
    )


# -- the parts the commands build too ---------------------------------------------------------


def create_backend(config: Config, *, quiet: bool = False) -> UserBackend:
    """Build (not start) the user backend `[backend] type` names, from its sections. `quiet`:
    for a command, which keeps its output to its answer (no warning of a users file others
    may read: it only reads the file, or rewrites it without access for others)."""
    name = config.get("backend", "type")
    options = dict(config.sections.get(f"backend.{name}", {}))
    # Sub-tables such as [backend.ldap.attributes] arrive as nested dicts.
    prefix = f"backend.{name}."
    for section, values in config.sections.items():
        if section.startswith(prefix):
            options[section[len(prefix):]] = dict(values)
    backend = backends.create_backend(name, options, config_dir=config.config_dir)
    if quiet and isinstance(backend, FileBackend):
        backend.warn_exposed = False
    return backend


def create_session_store(config: Config) -> SessionStore:
    """Build (not start) the session store `[sessions] store` names."""
    kind = config.get("sessions", "store")
    return backends.sessions.create_session_store(
        kind, dict(config.section(f"sessions.{kind}")), config_dir=config.config_dir
    )


async def start_stores(config: Config, *, quiet: bool = False) -> tuple[UserBackend, SessionStore]:
    """Build and start the user backend, then the session store (the backend closed again if
    the store fails): a broken user store fails first, before any session file is made."""
    backend = create_backend(config, quiet=quiet)
    try:
        await backend.start()
        session_store = create_session_store(config)
        await session_store.start()
    except BaseException:
        await backend.close()
        raise
    return backend, session_store


@contextlib.asynccontextmanager
async def open_stores(config: Config, *, quiet: bool = False) -> AsyncIterator[tuple[UserBackend, SessionStore]]:
    """`start_stores`, closed again in reverse order when the block is left, on an error too."""
    backend, session_store = await start_stores(config, quiet=quiet)
    try:
        yield backend, session_store
    finally:
        try:
            await session_store.close()
        finally:
            await backend.close()


def build_credentials(config: Config, secret: str) -> Credentials:
    """The credential fingerprints' keys: the signing secret, then the previous ones."""
    return Credentials(
        secret,
        config.get("auth", "previous_jwt_secrets"),
        end_on_password_change=config.get("sessions", "end_on_password_change"),
    )


def build_sessions(
    config: Config,
    session_store: SessionStore,
    metrics: Metrics | None = None,
    *,
    lifetime: int | None = None,
    grants: OAuthStore | None = None,
) -> Sessions:
    """The sessions service; `lifetime` (seconds, 0 for none) instead of `[auth] token_lifetime`;
    `grants`: the OAuth grants told of an access token's first use (`[oauth]` on)."""
    return Sessions(
        session_store,
        lifetime=config.get("auth", "token_lifetime") if lifetime is None else lifetime,
        touch_interval=config.get("sessions", "touch_interval"),
        metrics=metrics,
        grants=grants,
    )


def build_refresh(
    config: Config,
    session_store: SessionStore,
    *,
    users: Users,
    devices: Devices,
    credentials: Credentials,
    tokens: TokenIssuer,
    delegation: Delegation | None,
) -> LegacyRefresh:
    """The refresh tokens outside OAuth (homeserver.refresh): grants of the client `legacy`, whose
    access tokens live `[auth] refreshable_token_lifetime`."""
    issuer = TokenIssuer(tokens.secret, config.get("auth", "refreshable_token_lifetime"), previous=tokens.keys[1:])
    grants = Grants(
        session_store.oauth(), sessions=devices.sessions, devices=devices, users=users, credentials=credentials,
        tokens=issuer, delegation=delegation,
    )
    return LegacyRefresh(grants, credentials)


def build_second_factors(
    config: Config, session_store: SessionStore, metrics: Metrics | None = None
) -> SecondFactors | None:
    """The second factors of `[mfa]` on the session store's part (its key made on first start,
    its wrong-code limit in the shared buckets), or None when `[mfa]` is off."""
    if not config.get("mfa", "enabled"):
        return None
    observer = metrics.observe_second_factor if metrics is not None else None
    return SecondFactors.from_config(config, session_store.factors(), session_store.buckets(), observer)


def build_delegation(config: Config, sessions: Sessions, metrics: Metrics | None = None) -> Delegation | None:
    """The client of the Synapse behind us, on the session store's delegation state; None
    when `[delegation]` is off."""
    settings = load_delegation_settings(config)
    if settings is None:
        return None
    return Delegation(
        settings, sessions, config.get("server", "server_name"), metrics=metrics,
        state=sessions.store.delegation(),
    )


def build_sweeper(
    delegation: Delegation | None,
    users: Users,
    devices: Devices,
    metrics: Metrics | None = None,
    *,
    deactivated_at_synapse: DeactivatedAtSynapse | None = None,
    on_demand: bool = False,
) -> Sweeper | None:
    """The directory sweep and when it runs (`[delegation] sync_interval`, `deactivate_after`);
    None when delegation is off, or when its sweeps are (0) unless `on_demand` (a command)."""
    if delegation is None or (delegation.settings.sync_interval <= 0 and not on_demand):
        return None
    sweep = DirectorySweep(
        delegation, users, devices, deactivate_after=delegation.settings.deactivate_after,
        deactivated_at_synapse=deactivated_at_synapse, metrics=metrics,
    )
    return Sweeper(sweep, delegation.state, delegation.settings.sync_interval, metrics=metrics)
