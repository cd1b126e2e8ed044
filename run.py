#!/usr/bin/env python3
"""Entry point: `python run.py [serve|hash-password|add-user] ...`."""

import sys

if sys.version_info < (3, 11):  # noqa: UP036 (tomllib; this line must run on older Pythons to say so)
    sys.exit(f"homeserver: error: Python 3.11 or newer is needed (this is {sys.version.split()[0]})")

from homeserver.process.early_signals import EARLY

if __name__ == "__main__":
    # SIGTERM, SIGINT and SIGHUP during the imports below are noted, not met with their
    # default action: `serve` acts on them once it can, every other command gets them back.
    EARLY.install()

from homeserver.cli import main

if __name__ == "__main__":
    sys.exit(main())
