"""`run.py sessions adopt --from OLD_CONFIG`: carry the sessions over to a new user store.

Every session carries fingerprints of the account it was opened with (homeserver.credentials):
moved to another store (the users file to LDAP, say), every account looks replaced and every
session would end at its next use. This gives the open sessions of each user found in both
stores, opened with the account's current credential in the old one, the fingerprints of the
account in the new one. Users missing from the new store are listed and not carried. A dry
run unless `--yes`.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable

from backends.base import User
from backends.sessions.base import SessionStore
from homeserver.cli.stores import server_credentials, stores, user_backend
from homeserver.config import Config, load_config
from homeserver.credentials import Credentials
from homeserver.names import user_id
from homeserver.users import Users


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


async def adopt(new_config: Config, old_config: Config, apply: bool, out: Callable[[str], None]) -> None:
    """Say, per user with open sessions, what carrying them over does (and with `apply`, do it)."""
    credentials = server_credentials(new_config)
    server_name = new_config.get("server", "server_name")
    carried: dict[str, int] = {}
    missing: list[str] = []
    async with user_backend(old_config) as old_backend, stores(new_config) as (new_backend, store):
        old, new = Users(old_backend), Users(new_backend)
        for name in await store.users():
            before, after = await old.get(name), await new.get(name)
            line, count = await _one(store, credentials, name, before, after, apply)
            out(f"  {user_id(name, server_name)}: {line}")
            if after is None and before is not None:
                missing.append(user_id(name, server_name))
            elif count:
                carried[name] = count
    total = _plural(sum(carried.values()), "session") + " of " + _plural(len(carried), "user")
    not_carried = f" Not carried (not in the new user store): {', '.join(missing)}." if missing else ""
    if apply:
        out(f"Carried {total} over to the new user store.{not_carried}")
    else:
        out(
            f"Nothing was changed. With --yes, {total} are carried over.{not_carried} Stop the server first: "
            "one still on the old user store ends each carried session at its next use."
        )


async def _one(
    store: SessionStore, credentials: Credentials, name: str, before: User | None, after: User | None, apply: bool
) -> tuple[str, int]:
    """What carrying one user's sessions over does, in words, and how many sessions."""
    if before is None:
        return "not in the old user store either: left as they are (their tokens are refused)", 0
    identities, passwords = credentials.accepted(before)
    if after is None:
        count = await store.refingerprint(name, identities, passwords, None)
        return f"not in the new user store: {_plural(count, 'session')} not carried (they end at their next use)", 0
    new = credentials.of(after)
    if credentials.of(before) == new:
        return "the same account in both stores: nothing to carry", 0
    count = await store.refingerprint(name, identities, passwords, (new.identity, new.password) if apply else None)
    if count:
        return f"{_plural(count, 'session')} {'carried over' if apply else 'to carry over'}", count
    identities, passwords = credentials.accepted(after)
    if await store.refingerprint(name, identities, passwords, None):
        return "its sessions belong to the new user store already", 0
    return "no session opened with the account's current credential: nothing to carry", 0


def cmd_adopt(args: argparse.Namespace) -> int:
    new_config, old_config = load_config(args.config), load_config(args.old_config)
    what = "Carrying" if args.yes else "Would carry (a dry run)"
    print(
        f"{what} the sessions in the store of {new_config.path or 'the default config'} over to its user store "
        f"({new_config.get('backend', 'type')}), from that of {args.old_config} ({old_config.get('backend', 'type')}):"
    )
    asyncio.run(adopt(new_config, old_config, args.yes, lambda line: print(line, flush=True)))
    return 0


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `sessions adopt` to the `sessions` command."""
    ad = sub.add_parser(
        "adopt",
        help="after changing the user store: carry the sessions of users found in both stores over to the new one "
        "(a dry run without --yes)",
    )
    ad.add_argument("--from", dest="old_config", required=True, metavar="OLD_CONFIG",
                    help="the config naming the user store the sessions were opened with")
    ad.add_argument("--config", default=argparse.SUPPRESS, help="TOML config file naming the new user store")
    ad.add_argument("--yes", action="store_true", help="carry them over (without it, only say what would be done)")
    ad.set_defaults(func=cmd_adopt)
