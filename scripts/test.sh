#!/usr/bin/env bash
# Lint, type-check and run the whole test suite in its own virtualenv (.venv), installing what it needs first.
# Extra arguments go to pytest, e.g. scripts/test.sh tests/handlers -x
# --quick first skips ruff and mypy (one file, again and again): scripts/test.sh --quick tests/test_stops.py -x
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
quick=""
if [ "${1:-}" = --quick ]; then
    quick=1
    shift
fi
# The programs the tests start (redis-server, slapd, nginx, chromium, node...): installed
# when missing and this user may (root, or sudo without a password); otherwise one line says
# what to run, and their tests are skipped (failed when CI is set).
scripts/install-test-services.sh --if-allowed
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
# Reinstall only when a requirements or constraints file changed since the last install.
# The releases installed are the pinned and hashed ones of constraints-dev.txt (scripts/lock.sh
# writes it), so a new release of a dependency cannot change a run; they must still fit the
# ranges of requirements-dev.txt (and requirements.txt), or the lock is stale.
want=$(cat requirements*.txt constraints*.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat .venv/.requirements 2>/dev/null)" != "$want" ]; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --require-hashes -r constraints-dev.txt
    if ! check=$(.venv/bin/python -m pip install --disable-pip-version-check --dry-run -r requirements-dev.txt 2>&1) \
        || grep -q '^Would install' <<<"$check"; then
        printf '%s\n' "$check" | grep -v 'already satisfied' >&2
        echo "constraints-dev.txt does not satisfy requirements*.txt: run scripts/lock.sh" >&2
        exit 1
    fi
    echo "$want" > .venv/.requirements
fi
# Lint (ruff) and type-check (mypy) first: code either flags is refused before any test runs.
if [ -z "$quick" ]; then
    .venv/bin/ruff check --no-cache .
    .venv/bin/mypy
fi
exec .venv/bin/python -m pytest "$@"
