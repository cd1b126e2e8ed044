"""`run.py sessions issue NAME --device ID [--lifetime SECONDS]`: the operator opens a session for
a program (a bot, a bridge, a service) without the user's password, on a running server's store.

The access token is printed alone on standard output's first line; the audit line goes to the
log (standard error). The session is an ordinary session, opened with the fingerprints of the
user's credentials as they are now: listed, revoked and ended like the others, and ended when
the user is removed or their password is reset in the store. Its token lives until then, or
`--lifetime` seconds (not `[oauth] access_token_lifetime`: a program here has no refresh
token). Naming a device that has sessions replaces them. With delegation, Synapse has the user
and the device before the token is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from homeserver import audit
from homeserver.cli.common import UnknownTarget
from homeserver.cli.stores import server_credentials, server_secret, stores
from homeserver.config import Config, load_config
from homeserver.context import build_delegation, build_sessions
from homeserver.errors import MatrixError
from homeserver.logs import setup_cli_logging
from homeserver.names import local_name, user_id
from homeserver.oauth.scopes import DEVICE_ID
from homeserver.sessions import REPLACED
from homeserver.tokens import TokenIssuer
from homeserver.users import Users

MAX_LIFETIME = 10 * 365 * 86400  # seconds: ten years is "until revoked" spelled out
DISPLAY_NAME = "issued by the operator"


class IssueRefused(Exception):
    """The user cannot have a session now (locked), or Synapse could not be told."""


async def issue(config: Config, name: str, device_id: str, lifetime: int) -> str:
    """Open the session and return its access token (see the module's text)."""
    server_name = config.get("server", "server_name")
    secret = server_secret(config)  # before anything opens: no new secret, no store touched
    async with stores(config) as (backend, store):
        user = await Users(backend).get(name)
        if user is None:
            raise UnknownTarget(f"unknown user {name!r} in {user_store(config)}")
        if user.locked:
            raise IssueRefused(f"{user_id(name, server_name)} is locked: unlock the account first")
        fingerprint = server_credentials(config, secret).of(user)
        token = TokenIssuer(secret, lifetime, previous=config.get("auth", "previous_jwt_secrets")).issue(
            user.name, device_id
        )
        sessions = build_sessions(config, store, lifetime=lifetime)
        delegation = build_delegation(config, sessions)

        async def open_session() -> None:
            await sessions.end_devices(user.name, [device_id], REPLACED)
            await sessions.open(
                token, user.name, device_id, DISPLAY_NAME, "cli",
                identity_fp=fingerprint.identity, password_fp=fingerprint.password,
            )

        try:
            if delegation is None:
                await open_session()
            else:
                async with delegation.login(user, device_id, DISPLAY_NAME):
                    await open_session()
        except MatrixError as exc:  # Synapse unreachable or refusing: nothing was opened
            raise IssueRefused(f"Synapse could not be told, no session opened: {exc.message}") from None
        finally:
            if delegation is not None:
                await delegation.close()
        return token


def user_store(config: Config) -> str:
    """Which user store a command looked in, for its answer: the kind, where (no credentials)
    and the config that named it."""
    kind = config.get("backend", "type")
    if kind == "file":
        where = f" {config.resolve_path(config.get('backend.file', 'path'))}"
    elif kind == "ldap":
        where = f" at {config.get('backend.ldap', 'uri')}"
    else:
        where = ""
    return f"the {kind} user store{where} (config {config.path})"


def _unknown_user_hint(name: str, config: Config, config_given: bool) -> str:
    if config.get("backend", "type") == "ldap":
        first = "add it in the directory first"
    else:
        first = f"add it first: run.py add-user {name} --ident ID --no-password --config {config.path}"
    hint = "" if config_given else "; or name the server's config with --config"
    return f"{first}{hint}"


def _refuse(message: str) -> int:
    print(f"homeserver: error: {message}", file=sys.stderr)
    return 1


def cmd_issue(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    # The audit line goes where the server's log goes (standard error): stdout has the token alone.
    setup_cli_logging(config.get("logging", "level"), config.get("logging", "format"))
    audit.client_address.set("cli")
    name = local_name(args.name, config.get("server", "server_name"))
    if not DEVICE_ID.fullmatch(args.device):
        return _refuse(f"--device {args.device!r}: 1-255 of A-Z a-z 0-9 - . _ ~")
    lifetime = args.lifetime or 0
    if args.lifetime is not None and not 1 <= args.lifetime <= MAX_LIFETIME:
        return _refuse(f"--lifetime must be 1 to {MAX_LIFETIME} seconds")
    try:
        token = asyncio.run(issue(config, name, args.device, lifetime))
    except IssueRefused as exc:
        return _refuse(str(exc))
    except UnknownTarget as exc:
        return _refuse(f"{exc}: {_unknown_user_hint(name, config, getattr(args, 'config', None) is not None)}")
    reason = "issued by the operator (sessions issue)" + (f", lifetime {lifetime} s" if lifetime else "")
    audit.audit(audit.LOGIN, user=name, device=args.device, client="cli", outcome="success", reason=reason)
    print(token, flush=True)
    return 0


def add_command(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `sessions issue` beside `sessions list` and `sessions revoke`."""
    help_text = "open a session for a program (bot, service) without a password; prints its access token"
    issue_parser = actions.add_parser("issue", help=help_text, description=help_text)
    issue_parser.add_argument("name", help="account name or user ID")
    issue_parser.add_argument("--config", default=argparse.SUPPRESS, help="TOML config file")
    issue_parser.add_argument("--device", required=True, help="the device id of the session (replaces its sessions)")
    issue_parser.add_argument(
        "--lifetime", type=int, metavar="SECONDS", help="the token expires after this long (default: until revoked)"
    )
    issue_parser.set_defaults(func=cmd_issue)
