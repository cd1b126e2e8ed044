"""The command line (`run.py`): one module per command group, each adding its commands to the
parser (serve, the default; users: hash-password, add-user, lock, unlock; sessions: list, revoke,
adopt, issue; delegation: sync; migrate: migrate-synapse check and run; mfa: list, reset). The
commands build what they need with the server's own assembly (homeserver.context), on a
running server's stores (homeserver.cli.stores)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from homeserver import __version__
from homeserver.cli import delegation, mfa, migrate, serve, sessions, sessions_adopt, sessions_issue, users
from homeserver.cli.common import CommandError, UnknownTarget
from homeserver.errors import ConfigError, StoreDataError, StoreUnavailable
from homeserver.process.early_signals import EARLY


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="run.py", description="Matrix login-and-profile homeserver.")
    parser.add_argument("--version", action="version", version=f"homeserver {__version__}")
    parser.add_argument("--config", help="TOML config file (default: conf/homeserver.toml)")
    serve.add_options(parser)
    sub = parser.add_subparsers(
        title="commands",
        metavar="{serve,hash-password,add-user,lock,unlock,sessions,delegation,migrate-synapse,mfa}",
    )

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--config", default=argparse.SUPPRESS, help="TOML config file")
        return p

    serve.add_commands(command)
    users.add_commands(command)
    actions = sessions.add_commands(command)
    sessions_adopt.add_command(actions)
    sessions_issue.add_command(actions)
    delegation.add_commands(command)
    migrate.add_commands(command)
    mfa.add_commands(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.func is not serve.cmd_serve:
            # Only `serve` keeps the signals run.py noted (homeserver.process.early_signals);
            # a Ctrl-C noted during the imports is sent again here, and met as any later one.
            EARLY.release()
        return args.func(args)
    except (ConfigError, CommandError, UnknownTarget) as exc:
        print(f"homeserver: error: {exc}", file=sys.stderr)
        return 1
    except StoreUnavailable as exc:
        print(f"homeserver: error: {exc.store} unavailable: {exc}", file=sys.stderr)  # the user or the session store
        return 1
    except StoreDataError as exc:
        print(f"homeserver: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
