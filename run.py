#!/usr/bin/env python3
"""Entry point: `python run.py [serve|hash-password|add-user] ...`."""

import sys

from homeserver.cli import main

if __name__ == "__main__":
    sys.exit(main())
