"""Command line: serve (default), hash-password, add-user, sessions."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import re
import sys
from collections.abc import Sequence

from backends.base import STORED_FIELDS, User, UserExists, UserIncomplete, canonical_email
from homeserver.cli_sessions import UnknownTarget
from homeserver.cli_sessions import add_commands as add_session_commands
from homeserver.config import Config, load_config
from homeserver.errors import ConfigError, StoreDataError, StoreUnavailable
from homeserver.logs import setup_logging
from homeserver.names import MAX_USER_ID_BYTES, user_id
from homeserver.passwords import hash_password

# Matrix localpart grammar for new accounts (appendices, "User Identifiers").
NAME_RE = re.compile(r"[a-z0-9._=\-/+]+")


class CommandError(Exception):
    """A user mistake on the command line; printed as one line."""


def read_password(prompt: str = "Password: ") -> str:
    """One password: typed twice on a terminal, else the first line of standard input."""
    if sys.stdin.isatty():
        first = getpass.getpass(prompt)
        if getpass.getpass("Again: ") != first:
            raise CommandError("the passwords differ")
        password = first
    else:
        password = sys.stdin.readline().removesuffix("\n").removesuffix("\r")
    if not password:
        raise CommandError("the password is empty")
    return password


def _config(args: argparse.Namespace) -> Config:
    overrides = {
        "server": {
            "host": getattr(args, "host", None),
            "port": getattr(args, "port", None),
            "processes": getattr(args, "processes", None),
        }
    }
    return load_config(args.config, overrides=overrides)


def cmd_serve(args: argparse.Namespace) -> int:
    from homeserver.server import run

    config = _config(args)
    setup_logging(config.get("logging", "level"), config.get("logging", "format"))
    return run(config)


def cmd_hash_password(args: argparse.Namespace) -> int:
    rounds = args.rounds or load_config(args.config).get("auth", "bcrypt_rounds")
    print(hash_password(read_password(), rounds))
    return 0


def _given(value: str | None) -> str | None:
    """An optional field's command-line value: absent (None) stays None; "" removes the field."""
    return value or None


def cmd_add_user(args: argparse.Namespace) -> int:
    from homeserver.context import create_backend

    if not NAME_RE.fullmatch(args.name):
        raise CommandError(f"invalid name {args.name!r}: use only a-z, 0-9 and . _ = - / +")
    if args.ident == "":
        raise CommandError("--ident must not be empty")
    if not args.overwrite:
        if args.ident is None:
            raise CommandError("--ident is needed for a new user")
        if args.keep_password:
            raise CommandError("--keep-password only goes with --overwrite")
    if args.email and canonical_email(args.email) is None:
        raise CommandError(f"--email {args.email!r} is not an e-mail address")
    config = load_config(args.config)
    server_name = config.get("server", "server_name")
    if len(user_id(args.name, server_name).encode()) > MAX_USER_ID_BYTES:
        raise CommandError(f"the user ID would be longer than {MAX_USER_ID_BYTES} bytes")
    given = {"ident": args.ident, "display_name": args.display_name, "avatar_url": args.avatar_url, "email": args.email}
    # With --overwrite, every field not given stays as stored, those of User this command
    # has no option for included.
    keep = [name for name in STORED_FIELDS if name not in ("name", "password") and given.get(name) is None]
    password = None
    if args.keep_password:
        keep.append("password")
    else:
        password = hash_password(read_password(), args.rounds or config.get("auth", "bcrypt_rounds"))
    user = User(
        name=args.name,
        password=password,
        ident=args.ident or "",
        display_name=_given(args.display_name),
        avatar_url=_given(args.avatar_url),
        email=_given(args.email),
    )

    async def add() -> bool:
        backend = create_backend(config)
        try:
            return await backend.add_user(user, overwrite=args.overwrite, keep=keep)
        finally:
            await backend.close()

    try:
        replaced = asyncio.run(add())
    except UserExists:
        raise CommandError(f"user {args.name!r} exists already (use --overwrite to replace it)") from None
    except UserIncomplete as exc:
        needed = " and ".join("a password" if f == "password" else "--ident" for f in exc.fields)
        raise CommandError(f"user {args.name!r} does not exist; adding it needs {needed}") from None
    except NotImplementedError as exc:
        raise CommandError(f"{exc}; add users with your directory's own tools") from None
    print(f"{'replaced' if replaced else 'added'} {user_id(args.name, server_name)}")
    return 0


LDAP_LOCKING = (
    "the ldap backend cannot lock users: lock them in the directory with its own tools "
    "(Active Directory: disable the account; OpenLDAP: set pwdAccountLockedTime; 389-DS/FreeIPA: "
    "nsAccountLock=TRUE or ipa user-disable); the server follows [backend.ldap] locked_filter"
)


def cmd_lock(args: argparse.Namespace) -> int:
    """`lock NAME` / `unlock NAME`: set or clear the user's `locked` in the file or Redis."""
    from homeserver import audit
    from homeserver.context import create_backend
    from homeserver.names import local_name

    locked = args.lock
    config = load_config(args.config)
    server_name = config.get("server", "server_name")
    name = local_name(args.name, server_name)
    if config.get("backend", "type") == "ldap":
        raise CommandError(LDAP_LOCKING)

    async def change() -> bool:
        backend = create_backend(config)
        try:
            return await backend.set_locked(name, locked)
        finally:
            await backend.close()

    try:
        found = asyncio.run(change())
    except NotImplementedError as exc:
        raise CommandError(f"{exc}; lock them with your store's own tools") from None
    if not found:
        raise CommandError(f"unknown user {name!r}")
    # The audit line goes where the server's log goes (standard error, the configured format).
    setup_logging(config.get("logging", "level"), config.get("logging", "format"))
    audit.audit(audit.LOCK if locked else audit.UNLOCK, user=name, client="cli", reason="command line")
    print(f"{'locked' if locked else 'unlocked'} {user_id(name, server_name)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="run.py", description="Matrix login-and-profile homeserver.")
    parser.add_argument("--config", help="TOML config file (default: conf/homeserver.toml)")
    parser.add_argument("--host", help="listen address (overrides server.host)")
    parser.add_argument("--port", type=int, help="listen port (overrides server.port)")
    parser.add_argument("--processes", type=int, help="worker processes (overrides server.processes)")
    parser.set_defaults(func=cmd_serve)
    sub = parser.add_subparsers(title="commands", metavar="{serve,hash-password,add-user,lock,unlock,sessions}")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--config", default=argparse.SUPPRESS, help="TOML config file")
        return p

    serve = command("serve", "serve HTTP (the default)")
    serve.add_argument("--host", default=argparse.SUPPRESS, help="listen address")
    serve.add_argument("--port", type=int, default=argparse.SUPPRESS, help="listen port")
    serve.add_argument("--processes", type=int, default=argparse.SUPPRESS, help="worker processes")
    serve.set_defaults(func=cmd_serve)

    hp = command("hash-password", "read a password on stdin, print the hex text of its bcrypt hash")
    hp.add_argument("--rounds", type=int, choices=range(4, 32), metavar="4..31", help="bcrypt cost")
    hp.set_defaults(func=cmd_hash_password)

    au = command("add-user", "read a password on stdin and add the user to the configured backend")
    au.add_argument("name", help="account name (the localpart of the user ID)")
    au.add_argument("--ident", help="identifier text appended to the display name (needed for a new user)")
    au.add_argument("--display-name", help='display name ("" removes it)')
    au.add_argument("--avatar-url", help='avatar URL, mxc://... ("" removes it)')
    au.add_argument("--email", help='an e-mail address the user may also log in with ("" removes it)')
    au.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing user: the fields given change, the others stay as stored",
    )
    au.add_argument(
        "--keep-password", action="store_true", help="with --overwrite: keep the stored password (none is read)"
    )
    au.add_argument("--rounds", type=int, choices=range(4, 32), metavar="4..31", help="bcrypt cost")
    au.set_defaults(func=cmd_add_user)

    for verb, locking, what in (
        ("lock", True, "lock a user (file, Redis): their tokens answer M_USER_LOCKED, their sessions stay"),
        ("unlock", False, "unlock a user (file, Redis): their sessions work again"),
    ):
        lk = command(verb, what)
        lk.add_argument("name", help="account name or user ID")
        lk.set_defaults(func=cmd_lock, lock=locking)
    add_session_commands(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, CommandError, UnknownTarget) as exc:
        print(f"homeserver: error: {exc}", file=sys.stderr)
        return 1
    except StoreUnavailable as exc:
        print(f"homeserver: error: user store unavailable: {exc}", file=sys.stderr)
        return 1
    except StoreDataError as exc:
        print(f"homeserver: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
