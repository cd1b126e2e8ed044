"""`run.py delegation sync`: make Synapse agree with this server's sessions (recovery, first set-up)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable

from homeserver.cli.common import Command
from homeserver.cli.stores import stores
from homeserver.config import Config, load_config
from homeserver.context import build_delegation, build_sessions
from homeserver.delegation import SynapseError, load_delegation_settings
from homeserver.errors import ConfigError
from homeserver.names import user_id
from homeserver.users import Users


async def sync_all(config: Config, out: Callable[[str], None]) -> None:
    """Provision every user with a session (or a pending resync) and sync their devices; one line each."""
    if load_delegation_settings(config) is None:
        raise ConfigError("delegation.enabled: delegation is off in this config; nothing to sync")
    server_name = config.get("server", "server_name")
    async with stores(config) as (backend, store):
        delegation = build_delegation(config, build_sessions(config, store))
        assert delegation is not None  # on: said above
        try:
            users = Users(backend)
            names = sorted(set(await store.users()) | set(await delegation.state.resyncs()))
            counts: dict[str, int] = {}
            for name in names:
                user = await users.get(name)
                done, devices = await delegation.sync_user(name, user)
                counts[done] = counts.get(done, 0) + 1
                what = done if user is None else f"{done} at Synapse"
                out(f"{user_id(name, server_name)}: {what}; devices with a session here: {' '.join(devices) or 'none'}")
            out(sync_summary(len(names), counts))
        finally:
            await delegation.close()


def sync_summary(users: int, counts: dict[str, int]) -> str:
    """The last line of `delegation sync`: what it covered and what changed."""
    if not users:
        return "No user has a session here: nothing to sync."
    done = ", ".join(f"{counts[word]} {word}" for word in ("created", "updated", "reactivated", "unchanged",
                                                                     "not in the user store")
                     if counts.get(word))
    return (
        f"Synapse has the users and devices of the sessions here: {users} user{'s' if users != 1 else ''} "
        f"({done})."
    )


def cmd_sync(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    # A failure is said once, below, as the command's one error line.
    logging.getLogger("homeserver.delegation").setLevel(logging.CRITICAL)
    try:
        asyncio.run(sync_all(config, lambda line: print(line, flush=True)))
    except SynapseError as exc:
        print(f"homeserver: error: Synapse did not take it: {exc}", file=sys.stderr)
        return 1
    return 0


def add_commands(command: Command) -> None:
    """Add `delegation sync` to the command line."""
    parser = command("delegation", "the Synapse this server is the authentication service of")
    sub = parser.add_subparsers(title="actions", metavar="{sync}", required=True)
    sync = sub.add_parser(
        "sync",
        help="provision every user who has a session at Synapse and make Synapse's devices match the sessions here",
    )
    sync.add_argument("--config", default=argparse.SUPPRESS, help="TOML config file")
    sync.set_defaults(func=cmd_sync)
