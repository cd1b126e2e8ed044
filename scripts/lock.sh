#!/usr/bin/env bash
# Pin every dependency, with the hashes of every file PyPI has for the pinned releases:
#   constraints.txt      what requirements.txt needs (the server; README: pip install --require-hashes)
#   constraints-migrate.txt  what requirements-migrate.txt adds (migrate-synapse's optional
#                        PostgreSQL driver), with the same pins as constraints.txt for what they share;
#   constraints-dev.txt  what requirements-dev.txt needs (the tests, lint, types; scripts/test.sh),
#                        with the same pins as the two above for what they share.
# requirements*.txt keep their ranges; these files say which releases within them are installed,
# so a new release of any dependency changes nothing until this script is run again.
#
# Run it after changing requirements*.txt: pins that still fit are kept and only what changed
# is resolved again. `scripts/lock.sh --upgrade` (or `--upgrade-package NAME`) takes newer
# releases within the ranges. It resolves for the Python that runs it ($PYTHON, else python3;
# the project's is 3.11, Debian 12's) and for every platform at once (markers are kept, e.g.
# uvloop's), using pip-tools in a throw-away virtualenv.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
"$python" -m venv "$tools/venv"
"$tools/venv/bin/python" -m pip install --quiet --disable-pip-version-check "pip-tools==7.6.2"
compile() {
    CUSTOM_COMPILE_COMMAND=scripts/lock.sh "$tools/venv/bin/pip-compile" --quiet --generate-hashes \
        --allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links "$@"
}
compile "$@" --output-file constraints.txt requirements.txt
compile "$@" --constraint constraints.txt --output-file constraints-migrate.txt requirements-migrate.txt
compile "$@" --constraint constraints.txt --constraint constraints-migrate.txt --output-file constraints-dev.txt requirements-dev.txt
for lock in constraints.txt constraints-migrate.txt constraints-dev.txt; do
    echo "$lock: $(grep -c '^[a-zA-Z]' "$lock") pins"
done
