"""`run.py sessions list NAME` and `sessions revoke NAME --device ID | --all`, on a running server's store
(`sessions adopt`, `sessions issue`: homeserver.cli.sessions_adopt, sessions_issue)."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import unicodedata
from collections.abc import Awaitable, Callable

from homeserver import audit
from homeserver.cli.common import Command, UnknownTarget
from homeserver.cli.stores import stores
from homeserver.config import Config, load_config
from homeserver.context import build_delegation, build_sessions
from homeserver.delegation import load_delegation_settings
from homeserver.devices import Devices
from homeserver.logs import setup_cli_logging
from homeserver.names import local_name, user_id
from homeserver.sessions import Sessions
from homeserver.users import Users

# What clients chose (device ids, display names) is printed escaped, so one device is one
# line of exactly four tab-separated fields, whatever it holds.
_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape_char(char: str) -> str:
    if char in _ESCAPES:
        return _ESCAPES[char]
    if unicodedata.category(char) in ("Cc", "Zl", "Zp"):
        code = ord(char)
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    return char


def _field(value: str | None) -> str:
    """A field of `sessions list`: "-" when empty, control characters and backslashes escaped."""
    if not value:
        return "-"
    return "".join(map(_escape_char, value))


def _when(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def _with_sessions(
    config: Config, name: str, work: Callable[[Sessions, str], Awaitable[list[str]]]
) -> list[str]:
    """Open the stores, check that the user is known to one of them, run `work`, close."""
    async with stores(config) as (backend, store):
        # A user removed from the user store can still have sessions to end.
        if not await store.devices(name) and await Users(backend).get(name) is None:
            raise UnknownTarget(f"unknown user {name!r}")
        return await work(build_sessions(config, store), name)


def cmd_list(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    name = local_name(args.name, config.get("server", "server_name"))

    async def work(sessions: Sessions, name: str) -> list[str]:
        devices = sorted(await sessions.store.devices(name), key=lambda d: d.device_id)
        return [
            "\t".join((_field(d.device_id), _field(d.display_name), _field(d.last_seen_ip), _when(d.last_seen_ts)))
            for d in devices
        ]

    return _run(config, name, work)


def ended_sentence(count: int, what: str) -> str:
    """What `sessions revoke` did, as one sentence."""
    if count == 0:
        return f"No session of {what} was open: nothing ended."
    return f"Ended {count} session{'' if count == 1 else 's'} of {what}."


def cmd_revoke(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    # The revocation's audit line goes to the log, not the terminal (homeserver.logs).
    setup_cli_logging(config.get("logging", "level"), config.get("logging", "format"))
    audit.client_address.set("cli")
    server_name = config.get("server", "server_name")
    name = local_name(args.name, server_name)
    who = user_id(name, server_name)
    load_delegation_settings(config)  # a bad [delegation] section is said before any store opens

    async def work(sessions: Sessions, name: str) -> list[str]:
        if not args.all and await sessions.store.device(name, args.device) is None:
            raise UnknownTarget(f"{who} has no device {args.device!r}")
        # With delegation, Synapse deletes the devices too, before this returns.
        delegation = build_delegation(config, sessions)
        try:
            # --all ends the account page's sign-ins (browser sessions) too.
            devices = Devices(sessions, delegation=delegation, browser_sessions=sessions.store.browser_sessions())
            count = await devices.revoke(name, None if args.all else [args.device])
            pending = delegation is not None and name in await delegation.state.resyncs()
        finally:
            if delegation is not None:
                await delegation.close()
        what = f"{who}" if args.all else f"device {args.device} of {who}"
        lines = [ended_sentence(count, what)]
        if pending:
            lines.append("Synapse could not be told yet: the running server tells it as soon as it answers.")
        return lines

    return _run(config, name, work)


def _run(config: Config, name: str, work: Callable[[Sessions, str], Awaitable[list[str]]]) -> int:
    lines = asyncio.run(_with_sessions(config, name, work))
    for line in lines:
        print(line)
    return 0


def add_commands(command: Command) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    """Add `sessions list` and `sessions revoke` to the command line; the `sessions` actions."""
    parser = command("sessions", "list or end a user's sessions (works on a running server's store)")
    sub = parser.add_subparsers(title="actions", required=True)
    ls = sub.add_parser("list", help="one line per device: device id, display name, last address, last seen (UTC)")
    ls.add_argument("name", help="account name or user ID")
    ls.add_argument("--config", default=argparse.SUPPRESS, help="TOML config file")
    ls.set_defaults(func=cmd_list)
    rv = sub.add_parser("revoke", help="end the sessions of one device, or all of the user's")
    rv.add_argument("name", help="account name or user ID")
    rv.add_argument("--config", default=argparse.SUPPRESS, help="TOML config file")
    which = rv.add_mutually_exclusive_group(required=True)
    which.add_argument("--device", help="the device whose sessions end")
    which.add_argument("--all", action="store_true", help="every session of the user")
    rv.set_defaults(func=cmd_revoke)
    return sub  # more actions join it (homeserver.cli.sessions_adopt, sessions_issue)
