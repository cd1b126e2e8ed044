"""`run.py [serve]`: serve HTTP, the default command."""

from __future__ import annotations

import argparse

from homeserver.cli.common import Command
from homeserver.config import Config, load_config
from homeserver.logs import setup_logging


def _config(args: argparse.Namespace) -> Config:
    overrides = {
        "server": {
            "host": getattr(args, "host", None),
            "port": getattr(args, "port", None),
            "processes": getattr(args, "processes", None),
        }
    }
    # The warnings wait until logging is set up, so they come out in its format (JSON lines).
    return load_config(args.config, overrides=overrides, defer_warnings=True)


def cmd_serve(args: argparse.Namespace) -> int:
    from homeserver.process.server import run

    config = _config(args)
    setup_logging(config.get("logging", "level"), config.get("logging", "format"))
    config.log_warnings()
    return run(config)


def add_options(parser: argparse.ArgumentParser) -> None:
    """Serving's options on the command line itself: serving is what `run.py` alone does."""
    parser.add_argument("--host", help="listen address (overrides server.host)")
    parser.add_argument("--port", type=int, help="listen port (overrides server.port)")
    parser.add_argument("--processes", type=int, help="worker processes (overrides server.processes)")
    parser.set_defaults(func=cmd_serve)


def add_commands(command: Command) -> None:
    """Add `serve`."""
    serve = command("serve", "serve HTTP (the default)")
    serve.add_argument("--host", default=argparse.SUPPRESS, help="listen address")
    serve.add_argument("--port", type=int, default=argparse.SUPPRESS, help="listen port")
    serve.add_argument("--processes", type=int, default=argparse.SUPPRESS, help="worker processes")
    serve.set_defaults(func=cmd_serve)
