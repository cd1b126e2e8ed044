"""`run.py migrate-synapse check|run --synapse-config PATH`: moving a running Synapse here
(docs/migration.md; the check is homeserver/migration/check.py, the import importer.py).

`check` reads Synapse's config and database and this server's config and user store, and
prints one line per finding (`error:` or `warning:`) then a summary; exit 1 on an error.
`run` makes the same check (its errors stop it: one line each, exit 1), prints its warnings,
then imports and prints what it carried; `--dry-run` reads only and prints what a run would
carry. On a terminal, a line that rewrites itself shows how far the import is (standard
error; nothing on a pipe).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import TextIO

from backends.base import UserBackend
from backends.sessions.base import SessionStore
from backends.sessions.sqlite.schema import VERSION
from backends.synapse.config import load_synapse_config
from backends.synapse.database import SynapseDatabase, SynapseReadError
from homeserver.cli.common import Command
from homeserver.cli.stores import server_credentials, server_secret, stores, user_backend
from homeserver.config import Config, load_config
from homeserver.errors import ConfigError, StoreDataError, StoreUnavailable
from homeserver.logs import setup_cli_logging
from homeserver.migration.check import CheckReport, check
from homeserver.migration.importer import ImportCounts, Importer
from homeserver.migration.report import count_lines
from homeserver.users import Users


class Progress:
    """`done of total users` on one line of `stream` that rewrites itself, only on a terminal."""

    def __init__(self, stream: TextIO, label: str) -> None:
        self.stream = stream
        self.label = label
        self.shown = stream.isatty()

    def __call__(self, done: int, total: int) -> None:
        if self.shown:
            self.stream.write(f"\r{self.label}: {done:,} of {total:,} users")
            self.stream.flush()

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()


async def _check(config: Config, paths: list[str]) -> CheckReport:
    async with user_backend(config) as backend:
        return await check(paths, config, backend)


def cmd_check(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    setup_cli_logging("ERROR", config.get("logging", "format"))
    report = asyncio.run(_check(config, args.synapse_config))
    for line in report.lines():
        print(line)
    return 0 if report.ok else 1


def session_schema_version(path: str) -> int:
    """The schema version of a SQLite session file, read from its header (PRAGMA user_version is
    the big-endian 4 bytes at offset 60), without opening it as a database (which writes)."""
    try:
        with open(path, "rb") as fh:
            header = fh.read(64)
    except OSError:
        return 0
    return int.from_bytes(header[60:64], "big") if len(header) == 64 else 0


def _dry_run_allowed(config: Config) -> None:
    """A dry run writes nothing: not even the schema update a store of an older version gets at open."""
    if config.get("sessions", "store") != "sqlite":
        return
    path = config.get("sessions.sqlite", "path")
    if os.path.exists(path) and session_schema_version(path) < VERSION:
        raise ConfigError(
            f"sessions.sqlite.path: {path} was made by an older version of this server: start this version once "
            "(it brings the file up to date), then run the dry run again"
        )


async def _import(config: Config, paths: list[str], dry_run: bool, progress: Progress) -> ImportCounts:
    synapse = load_synapse_config(paths)
    assert synapse.database is not None  # the check said so
    secret = server_secret(config)  # a server has run here: its tokens' secret, never a new one
    if dry_run:
        _dry_run_allowed(config)
    async with stores(config) as (backend, store):
        importer = _importer(config, backend, store, secret, dry_run, progress)
        with SynapseDatabase.open(synapse.database) as database:
            return await importer.run(database, synapse.server_name)


def _importer(config: Config, backend: UserBackend, store: SessionStore, secret: str, dry_run: bool,
              progress: Progress) -> Importer:
    return Importer(
        users=Users(backend), backend=backend, imported=store.imported(),
        credentials=server_credentials(config, secret), directory=config.get("backend", "type") == "ldap",
        admins=frozenset(config.get("delegation", "admins")), dry_run=dry_run, progress=progress,
    )


def cmd_run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    setup_cli_logging("ERROR", config.get("logging", "format"))
    started = time.monotonic()
    report = asyncio.run(_check(config, args.synapse_config))
    if not report.ok:
        for finding in report.errors:
            print(finding)
        return 1
    for finding in report.warnings:
        print(finding)
    progress = Progress(sys.stderr, "migrate-synapse run" + (" --dry-run" if args.dry_run else ""))
    try:
        counts = asyncio.run(_import(config, args.synapse_config, args.dry_run, progress))
    except (SynapseReadError, StoreUnavailable, StoreDataError, ConfigError, OSError) as exc:
        # OSError: the users file could not be written (its folder's permissions, a full disk).
        progress.clear()
        what = "Synapse's database" if isinstance(exc, SynapseReadError) else "this server's stores"
        print(f"error: {what}: {exc}; users written before it stand, whole, and a run again completes the move")
        return 1
    progress.clear()
    for line in count_lines(counts, config, dry_run=args.dry_run, seconds=time.monotonic() - started):
        print(line)
    return 0


def add_commands(command: Command) -> None:
    """Add `migrate-synapse check` and `migrate-synapse run` to the command line."""
    parser = command("migrate-synapse", "move a running Synapse here with nobody signed out (docs/migration.md)")
    sub = parser.add_subparsers(title="actions", metavar="{check,run}", required=True)
    for name, help_text, func in (
        ("check", "say what would block or surprise the move: one line per finding, then a summary", cmd_check),
        ("run", "import Synapse's users, devices, tokens and states into this server's stores", cmd_run),
    ):
        action = sub.add_parser(name, help=help_text, description=help_text)
        action.add_argument(
            "--synapse-config", required=True, action="append", metavar="PATH",
            help="Synapse's homeserver.yaml (a folder of *.yaml, or several, as synapse -c takes them)",
        )
        action.add_argument("--config", default=argparse.SUPPRESS, help="TOML config file")
        if name == "run":
            action.add_argument("--dry-run", action="store_true", help="read only and print what a run would do")
        action.set_defaults(func=func)
