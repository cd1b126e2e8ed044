"""`run.py mfa list NAME` and `mfa reset NAME`: a person's second factors on a running server's
session store (`[mfa]`, docs/mfa.md). Neither needs the operator's key: `list` shows what the
store holds of each factor (never a secret: those are sealed), `reset` removes them all (the
person who lost their phone signs in with their password again, and adds a new one at their
next browser sign-in where one is required). Both work with `[mfa]` off too, on what an
earlier run kept."""

from __future__ import annotations

import argparse
import asyncio
import datetime

from backends.sessions.factors import RECOVERY, Factor
from homeserver import audit
from homeserver.cli.common import Command, UnknownTarget
from homeserver.cli.sessions import _field
from homeserver.cli.stores import stores
from homeserver.config import Config, load_config
from homeserver.logs import setup_cli_logging
from homeserver.mfa.service import FACTORS_RESET
from homeserver.names import local_name, user_id
from homeserver.users import Users

KINDS = {"totp": "app", "webauthn": "passkey", RECOVERY: "recovery"}


def _when(ms: int) -> str:
    if not ms:
        return "never"
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def line(factor: Factor) -> str:
    """One factor, tab-separated: its id, kind (app, passkey, recovery), name (for recovery
    codes, how many are left), added and last used (UTC, or "never")."""
    name = f"{len(factor.code_hashes)} codes left" if factor.kind == RECOVERY else factor.name
    return "\t".join(
        (_field(factor.factor_id), KINDS.get(factor.kind, factor.kind), _field(name),
         _when(factor.created_ts), _when(factor.last_used_ts))
    )


async def _factors(config: Config, name: str, reset: bool) -> list[str]:
    async with stores(config) as (backend, store):
        part = store.factors()
        found = await part.factors(name)
        # A person gone from the user store may still have factors to list or remove.
        if not found and await Users(backend).get(name) is None:
            raise UnknownTarget(f"unknown user {name!r}")
        if not reset:
            return [line(f) for f in found]
        count = await part.remove_all(name)
        audit.audit(FACTORS_RESET, user=name, count=count, reason="run.py mfa reset")
        who = user_id(name, config.get("server", "server_name"))
        if not count:
            return [f"{who} had no second factor: nothing removed."]
        return [f"Removed {count} second factor{'' if count == 1 else 's'} of {who} (recovery codes included)."]


def cmd_list(args: argparse.Namespace) -> int:
    return _run(args, reset=False)


def cmd_reset(args: argparse.Namespace) -> int:
    return _run(args, reset=True)


def _run(args: argparse.Namespace, *, reset: bool) -> int:
    config = load_config(args.config)
    if reset:  # the reset's audit line goes to the log, not the terminal (homeserver.logs)
        setup_cli_logging(config.get("logging", "level"), config.get("logging", "format"))
        audit.client_address.set("cli")
    name = local_name(args.name, config.get("server", "server_name"))
    for text in asyncio.run(_factors(config, name, reset)):
        print(text)
    return 0


def add_commands(command: Command) -> None:
    """Add `mfa list` and `mfa reset` to the command line."""
    parser = command("mfa", "list or remove a person's second factors (works on a running server's store)")
    sub = parser.add_subparsers(title="actions", required=True)
    ls = sub.add_parser(
        "list", help="one line per second factor: id, kind (app, passkey, recovery), name, added, last used (UTC)"
    )
    ls.add_argument("name", help="account name or user ID")
    ls.add_argument("--config", default=argparse.SUPPRESS, help="TOML config file")
    ls.set_defaults(func=cmd_list)
    rs = sub.add_parser("reset", help="remove every second factor of the person (audited): they lost their phone")
    rs.add_argument("name", help="account name or user ID")
    rs.add_argument("--config", default=argparse.SUPPRESS, help="TOML config file")
    rs.set_defaults(func=cmd_reset)
