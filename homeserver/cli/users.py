"""`run.py hash-password`, `add-user`, `lock` and `unlock`: the user store's commands (the users file, Redis)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import getpass
import os
import re
import secrets
import sys
import unicodedata

from backends.base import STORED_FIELDS, User, UserBackend, UserExists, UserIncomplete, canonical_email
from homeserver.cli.common import Command, CommandError
from homeserver.cli.stores import user_backend
from homeserver.config import Config, load_config
from homeserver.config_schema import server_name_problem
from homeserver.errors import ConfigError
from homeserver.logs import setup_cli_logging
from homeserver.names import MAX_USER_ID_BYTES, user_id
from homeserver.passwords import hash_password

# Matrix localpart grammar for new accounts (appendices, "User Identifiers").
NAME_RE = re.compile(r"[a-z0-9._=\-/+]+")
# mxc://<server name>/<media id>; media ids are A-Z a-z 0-9 _ - (Matrix "Matrix Content URIs").
MXC_RE = re.compile(r"mxc://([^/]+)/[A-Za-z0-9_-]+")


def read_password(prompt: str = "Password: ") -> str:
    """One password: typed twice on a terminal, else the first line of standard input."""
    if sys.stdin is None:  # started with standard input closed (`<&-`): Python gives no stdin at all
        raise CommandError("no password: standard input is closed")
    try:
        if sys.stdin.isatty():
            first = getpass.getpass(prompt)
            if getpass.getpass("Again: ") != first:
                raise CommandError("the passwords differ")
            password = first
        else:
            line = sys.stdin.readline()
            if not line:
                raise CommandError("no password: standard input is empty or closed")
            password = line.removesuffix("\n").removesuffix("\r")
    except EOFError:  # Ctrl-D at the prompt
        raise CommandError("no password given (end of input)") from None
    if not password:
        raise CommandError("the password is empty")
    return password


def _check_text(option: str, value: str | None) -> None:
    """No control characters (newlines, tabs) in a stored value: they would break displays and lines."""
    if value and any(unicodedata.category(c) == "Cc" or c in "\u2028\u2029" for c in value):
        raise CommandError(f"{option} must not contain newlines, tabs or other control characters")


def _check_avatar(value: str | None) -> None:
    """An avatar is an mxc:// URI (mxc://<server name>/<media id>); "" removes it."""
    if not value:
        return
    match = MXC_RE.fullmatch(value)
    if match is None or server_name_problem(match.group(1)) is not None:
        raise CommandError(f"--avatar-url {value!r} is not an mxc:// URI (mxc://<server name>/<media id>)")


def cmd_hash_password(args: argparse.Namespace) -> int:
    rounds = args.rounds or load_config(args.config).get("auth", "bcrypt_rounds")
    print(hash_password(read_password(), rounds))
    return 0


def _given(value: str | None) -> str | None:
    """An optional field's command-line value: absent (None) stays None; "" removes the field."""
    return value or None


def cmd_add_user(args: argparse.Namespace) -> int:
    # Everything that can be checked is checked before the password is read and hashed.
    if not NAME_RE.fullmatch(args.name):
        raise CommandError(f"invalid name {args.name!r}: use only a-z, 0-9 and . _ = - / +")
    if args.ident == "":
        raise CommandError("--ident must not be empty")
    if not args.overwrite:
        if args.ident is None:
            raise CommandError("--ident is needed for a new user")
        if args.keep_password:
            raise CommandError("--keep-password only goes with --overwrite")
    if args.no_password and args.keep_password:
        raise CommandError("--no-password and --keep-password do not go together")
    for option, value in (
        ("--ident", args.ident), ("--display-name", args.display_name), ("--avatar-url", args.avatar_url),
        ("--email", args.email),
    ):
        _check_text(option, value)
    _check_avatar(args.avatar_url)
    if args.email and canonical_email(args.email) is None:
        raise CommandError(f"--email {args.email!r} is not an e-mail address")
    config = load_config(args.config)
    server_name = config.get("server", "server_name")
    if len(user_id(args.name, server_name).encode()) > MAX_USER_ID_BYTES:
        raise CommandError(f"the user ID would be longer than {MAX_USER_ID_BYTES} bytes")
    asyncio.run(_check_store(config, args, server_name))
    given = {"ident": args.ident, "display_name": args.display_name, "avatar_url": args.avatar_url, "email": args.email}
    # With --overwrite, every field not given stays as stored, those of User this command
    # has no option for included.
    keep = [name for name in STORED_FIELDS if name not in ("name", "password") and given.get(name) is None]
    password = None
    rounds = args.rounds or config.get("auth", "bcrypt_rounds")
    if args.keep_password:
        keep.append("password")
    elif args.no_password:
        # The hash of 256 random bits nobody keeps: no password logs in, in any store's format,
        # and a try costs what any other login costs (nothing tells a bot's account apart).
        password = hash_password(secrets.token_urlsafe(32), rounds)
    else:
        password = hash_password(read_password(), rounds)
    user = User(
        name=args.name,
        password=password,
        ident=args.ident or "",
        display_name=_given(args.display_name),
        avatar_url=_given(args.avatar_url),
        email=_given(args.email),
    )

    async def add() -> bool:
        async with user_backend(config, start=False) as backend:
            return await backend.add_user(user, overwrite=args.overwrite, keep=keep)

    try:
        replaced = asyncio.run(add())
    except UserExists:
        raise CommandError(f"user {args.name!r} exists already (use --overwrite to replace it)") from None
    except UserIncomplete as exc:
        raise CommandError(_incomplete(args.name, exc.fields)) from None
    except NotImplementedError as exc:
        raise CommandError(f"{exc}; add users with your directory's own tools") from None
    print(f"{'replaced' if replaced else 'added'} {user_id(args.name, server_name)}")
    return 0


def _incomplete(name: str, fields: list[str]) -> str:
    needed = " and ".join("a password" if f == "password" else "--ident" for f in fields)
    return f"user {name!r} does not exist; adding it needs {needed}"


async def _check_store(config: Config, args: argparse.Namespace, server_name: str) -> None:
    """Before any password is read: the name taken (without --overwrite), a user to replace
    that does not exist (without --ident or with --keep-password), an address someone else
    holds (compared as logins compare them). `add_user` still enforces the first two."""
    # Read the users file as it is: a record with a bad password must not stop the
    # replacement that fixes it, and nothing polls.
    relaxed = dict(config.sections)
    relaxed["backend.file"] = {**relaxed["backend.file"], "check_passwords": False, "reload_interval": 0}
    async with user_backend(dataclasses.replace(config, sections=relaxed), start=False) as backend:
        if type(backend).add_user is UserBackend.add_user:
            return  # no adding here (LDAP): add_user says so
        try:
            await backend.start()
        except ConfigError:
            if config.get("backend", "type") != "file" or os.path.exists(
                config.resolve_path(config.get("backend.file", "path"))
            ):
                raise
            return  # no users file yet: add_user creates it
        existing = await backend.get_user(args.name)
        if existing is not None and not args.overwrite:
            raise CommandError(f"user {args.name!r} exists already (use --overwrite to replace it)")
        if existing is None:
            missing = [f for f, absent in (("ident", args.ident is None), ("password", args.keep_password)) if absent]
            if missing:
                raise CommandError(_incomplete(args.name, missing))
        address = canonical_email(args.email) if args.email else None
        if address is not None:
            holders = [u.name for u in await backend.get_users_by_email(address) if u.name != args.name]
            if holders:
                raise CommandError(
                    f"--email {args.email!r}: {user_id(holders[0], server_name)} has this address already "
                    "(an address logs in one user only)"
                )


LDAP_LOCKING = (
    "the ldap backend cannot lock users: lock them in the directory with its own tools "
    "(Active Directory: disable the account; OpenLDAP: set pwdAccountLockedTime; 389-DS/FreeIPA: "
    "nsAccountLock=TRUE or ipa user-disable); the server follows [backend.ldap] locked_filter"
)


def cmd_lock(args: argparse.Namespace) -> int:
    """`lock NAME` / `unlock NAME`: set or clear the user's `locked` in the file or Redis."""
    from homeserver import audit
    from homeserver.names import local_name

    locked = args.lock
    config = load_config(args.config)
    server_name = config.get("server", "server_name")
    name = local_name(args.name, server_name)
    if config.get("backend", "type") == "ldap":
        raise CommandError(LDAP_LOCKING)

    async def change() -> bool:
        async with user_backend(config, start=False) as backend:
            return await backend.set_locked(name, locked)

    try:
        found = asyncio.run(change())
    except NotImplementedError as exc:
        raise CommandError(f"{exc}; lock them with your store's own tools") from None
    if not found:
        raise CommandError(f"unknown user {name!r}")
    # The audit line goes where the server's log goes (standard error, the configured format).
    setup_cli_logging(config.get("logging", "level"), config.get("logging", "format"))
    audit.audit(audit.LOCK if locked else audit.UNLOCK, user=name, client="cli", reason="command line")
    print(f"{'locked' if locked else 'unlocked'} {user_id(name, server_name)}")
    return 0


def add_commands(command: Command) -> None:
    """Add `hash-password`, `add-user`, `lock` and `unlock`."""
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
    au.add_argument(
        "--no-password",
        action="store_true",
        help="store no usable password (none is read): an account for a program, given tokens by sessions issue",
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
