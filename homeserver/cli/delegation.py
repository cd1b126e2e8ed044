"""`run.py delegation sync`: make Synapse agree with this server's sessions (recovery, first set-up);
`delegation sync --all`: one sweep of the whole user store now (homeserver.delegation.sweep)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable

from homeserver import audit
from homeserver.cli.common import Command, CommandError
from homeserver.cli.stores import server_credentials, stores
from homeserver.config import Config, load_config
from homeserver.context import build_delegation, build_sessions, build_sweeper
from homeserver.delegation import SynapseError, SynapseMisconfigured, SynapseRefused, load_delegation_settings
from homeserver.delegation.sweeper import SweepBusy, SweepLost
from homeserver.devices import Devices
from homeserver.errors import ConfigError
from homeserver.logs import setup_cli_logging
from homeserver.names import user_id
from homeserver.users import Users

REFUSED = "refused"  # `delegation sync`: a user Synapse refused


async def sync_all(config: Config, out: Callable[[str], None]) -> int:
    """Provision every user with a session (or a pending resync) and sync their devices; one line
    each; how many users Synapse refused (a name it does not take, say: said on their line, their
    resync kept, the others synced all the same)."""
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
                try:
                    done, devices = await delegation.sync_user(name, user)
                except SynapseMisconfigured:
                    raise  # a wrong secret, no API: every user alike
                except SynapseRefused as exc:
                    counts[REFUSED] = counts.get(REFUSED, 0) + 1
                    out(f"{user_id(name, server_name)}: refused by Synapse: {exc}")
                    continue
                counts[done] = counts.get(done, 0) + 1
                what = done if user is None else f"{done} at Synapse"
                out(f"{user_id(name, server_name)}: {what}; devices with a session here: {' '.join(devices) or 'none'}")
            out(sync_summary(len(names), counts))
        finally:
            await delegation.close()
    return counts.get(REFUSED, 0)


async def sweep_all(
    config: Config, out: Callable[[str], None], *, dry_run: bool = False, allow_deactivations: bool = False
) -> str | None:
    """One sweep of the whole user store now, one line per user acted on and the summary
    (and the guard's line); what kept Synapse from taking it all, or None."""
    if load_delegation_settings(config) is None:
        raise ConfigError("delegation.enabled: delegation is off in this config; nothing to sync")
    async with stores(config) as (backend, store):
        sessions = build_sessions(config, store)
        delegation = build_delegation(config, sessions)
        try:
            devices = Devices(sessions, delegation=delegation, credentials=server_credentials(config),
                              browser_sessions=store.browser_sessions())
            sweeper = build_sweeper(delegation, Users(backend), devices, on_demand=True,
                                    deactivated_at_synapse=store.imported())
            assert sweeper is not None  # delegation is on: said above
            try:
                report = await sweeper.sweep_now(dry_run=dry_run, allow_deactivations=allow_deactivations, out=out)
            except SweepBusy as exc:
                raise CommandError(str(exc)) from None
            except SweepLost as exc:  # the session store lost it for a while, or the lease ran out
                raise CommandError(f"the sweep stopped part-way: {exc}; the next sweep does the rest") from None
        finally:
            if delegation is not None:
                await delegation.close()
    out(report.summary())
    guard = report.guard_line()
    if guard is not None:
        out(guard.replace("directory sweep: ", "", 1))
    return report.synapse_problem


def sync_summary(users: int, counts: dict[str, int]) -> str:
    """The last line of `delegation sync`: what it covered and what changed."""
    if not users:
        return "No user has a session here: nothing to sync."
    done = ", ".join(f"{counts[word]} {word}" for word in ("created", "updated", "reactivated", "unchanged",
                                                                     "not in the user store", REFUSED)
                     if counts.get(word))
    return (
        f"Synapse has the users and devices of the sessions here: {users} user{'s' if users != 1 else ''} "
        f"({done})."
    )


def cmd_sync(args: argparse.Namespace) -> int:
    if not args.all and (args.dry_run or args.allow_deactivations):
        raise CommandError("--dry-run and --allow-deactivations go with --all (a sweep of the whole user store)")
    config = load_config(args.config)
    if args.all:
        # Deactivations' and reactivations' audit lines go to the log, not the terminal (homeserver.logs).
        setup_cli_logging(config.get("logging", "level"), config.get("logging", "format"))
        audit.client_address.set("cli")
    # A failure is said once, below, as the command's one error line.
    logging.getLogger("homeserver.delegation").setLevel(logging.CRITICAL)
    out = lambda line: print(line, flush=True)  # noqa: E731
    try:
        if not args.all:
            refused = asyncio.run(sync_all(config, out))
            if refused:
                print(f"homeserver: error: Synapse refused {refused} user{'s' * (refused != 1)} (said above)",
                      file=sys.stderr)
            return 1 if refused else 0
        problem = asyncio.run(sweep_all(config, out, dry_run=args.dry_run,
                                        allow_deactivations=args.allow_deactivations))
    except SynapseError as exc:
        problem = str(exc)
    if problem is not None:
        print(f"homeserver: error: Synapse did not take it: {problem}", file=sys.stderr)
        return 1
    return 0


def add_commands(command: Command) -> None:
    """Add `delegation sync` to the command line."""
    parser = command("delegation", "the Synapse this server is the authentication service of")
    sub = parser.add_subparsers(title="actions", metavar="{sync}", required=True)
    sync = sub.add_parser(
        "sync",
        help="provision every user who has a session at Synapse and make Synapse's devices match the sessions here; "
             "with --all, sweep the whole user store now",
    )
    sync.add_argument("--config", default=argparse.SUPPRESS, help="TOML config file")
    sync.add_argument("--all", action="store_true",
                      help="one sweep of the whole user store: every user provisioned at Synapse, leavers signed "
                           "out and deactivated there after delegation.deactivate_after, returners reactivated")
    sync.add_argument("--dry-run", action="store_true", help="with --all: say what it would do, change nothing")
    sync.add_argument("--allow-deactivations", action="store_true",
                      help="with --all: deactivate even though the store shrank to under half of what the "
                           "previous sweep found (the guard)")
    sync.set_defaults(func=cmd_sync)
