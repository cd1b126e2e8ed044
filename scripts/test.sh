#!/usr/bin/env bash
# Run the whole test suite in its own virtualenv (.venv), installing what it needs first.
# Extra arguments go to pytest, e.g. scripts/test.sh tests/handlers -x
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
# Reinstall only when a requirements file changed since the last install.
want=$(cat requirements*.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat .venv/.requirements 2>/dev/null)" != "$want" ]; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
    echo "$want" > .venv/.requirements
fi
exec .venv/bin/python -m pytest "$@"
