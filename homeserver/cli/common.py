"""What every command group shares: its errors (one line on standard error, exit status 1) and
the parser's `command` maker."""

from __future__ import annotations

import argparse
from collections.abc import Callable

# `command(name, help)`: a new command's parser, taking --config (homeserver.cli.build_parser).
Command = Callable[[str, str], argparse.ArgumentParser]


class CommandError(Exception):
    """A user mistake on the command line; printed as one line."""


class UnknownTarget(Exception):
    """No such user (in the user store or the session store), or no such device of theirs."""
