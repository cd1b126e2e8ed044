#!/usr/bin/env bash
# Lint, type-check and run the whole test suite in its own virtualenv (.venv), installing what it needs first.
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
# Lint (ruff) and type-check (mypy) first: code either flags is refused before any test runs.
.venv/bin/ruff check --no-cache .
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
