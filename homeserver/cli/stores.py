"""The stores of a server that has run with a config, as every command opens them: the
assembly's (homeserver.context), never a new session file or a new signing secret.

`user_backend` gives the user backend alone (add-user, lock, unlock); `stores` gives it
with the session store (sessions, delegation sync). Leaving the `async with` closes what was
opened, in reverse order, on any error. `server_secret` and `server_credentials` give the
token signing secret such a server made, and the credential fingerprints made with it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator

from backends.base import UserBackend
from backends.sessions.base import SessionStore
from homeserver import context
from homeserver.config import Config
from homeserver.credentials import Credentials
from homeserver.errors import ConfigError
from homeserver.tokens import load_secret


@contextlib.asynccontextmanager
async def user_backend(config: Config, *, start: bool = True) -> AsyncIterator[UserBackend]:
    """The configured user backend, started unless `start` is False (adding and locking
    write the store without loading all of it first)."""
    # A command keeps its output to its answer: no warning of a users file others may read.
    backend = context.create_backend(config, quiet=True)
    try:
        if start:
            await backend.start()
        yield backend
    finally:
        await backend.close()


@contextlib.asynccontextmanager
async def stores(config: Config) -> AsyncIterator[tuple[UserBackend, SessionStore]]:
    """The user backend and the session store, both started, of a server that has run here."""
    _check_session_store_exists(config)
    async with context.open_stores(config, quiet=True) as opened:
        yield opened


def _check_session_store_exists(config: Config) -> None:
    """A running server has made its SQLite file: a missing one means another place (as root
    without the unit's STATE_DIRECTORY, say), where a new empty store would only mislead."""
    if config.get("sessions", "store") != "sqlite":
        return
    path = config.get("sessions.sqlite", "path")
    if not os.path.exists(path):
        raise ConfigError(
            f"sessions.sqlite.path: {path} does not exist: no server has run with this config here "
            f"(under systemd, run as the service user with STATE_DIRECTORY set, see docs/operations.md)"
        )


def server_secret(config: Config) -> str:
    """The token signing secret of a server that has run with this config: a command must not
    make a new one (its tokens and fingerprints would be refused by that server)."""
    if not config.get("auth", "jwt_secret") and not os.path.exists(
        config.resolve_path(config.get("auth", "secret_file"))
    ):
        raise ConfigError("auth.secret_file: no token signing secret yet: no server has run with this config here")
    return load_secret(config)


def server_credentials(config: Config, secret: str | None = None) -> Credentials:
    """The credential fingerprints' keys of that server (`secret`: server_secret, read already)."""
    return context.build_credentials(config, secret if secret is not None else server_secret(config))
