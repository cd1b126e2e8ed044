#!/usr/bin/env bash
# Install, from Debian's packages, what the tests need when it is missing: the servers the
# Redis and LDAP tests start privately (redis-server; slapd and ldap-utils; openssl for test
# certificates), the browser the account page tests drive (chromium, chromium-driver),
# Node.js with npm (the matrix-js-sdk client test installs its package from the npm
# registry), curl (the README's curl sessions are run), nginx (the reverse proxy in front of
# Synapse in the delegation tests), python3-venv (scripts/test.sh makes .venv),
# python3-olm (matrix-nio's encryption, for Debian's python3; the test makes its virtualenv,
# tests/support/nio_e2e.py) and postgresql (the migration tests start private clusters; the
# package's own is kept from starting). Needs root (or sudo). Then matrix-synapse from PyPI
# into its cached virtualenv outside the repository, with psycopg2-binary and
# matrix-synapse-ldap3 (tests/support/synapse.py), as the user running the tests.
#
#   scripts/install-test-services.sh               install what is missing (sudo when not root)
#   scripts/install-test-services.sh --if-allowed  the same when root, or when sudo asks no
#       password, and apt-get is there; otherwise one line on standard error naming what is
#       missing and what to run, and exit 0 (scripts/test.sh calls it so); an install that
#       fails (no network, a broken mirror) is one line too, naming the log, and exit 0
set -euo pipefail
cd "$(dirname "$0")/.."
mode=install
case "${1:-}" in
    "") ;;
    --if-allowed) mode=if-allowed ;;
    *) echo "usage: scripts/install-test-services.sh [--if-allowed]" >&2; exit 2 ;;
esac
install_synapse() {
    # Into the cache of the user who runs the tests (the one who called sudo, if any).
    if [ "$(id -u)" -eq 0 ] && [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ]; then
        sudo -u "$SUDO_USER" -H python3 tests/support/synapse.py install
    else
        python3 tests/support/synapse.py install
    fi
}
need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v slapd >/dev/null 2>&1 || [ -x /usr/sbin/slapd ] || need+=(slapd)
command -v ldapwhoami >/dev/null 2>&1 || need+=(ldap-utils)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx)
# PostgreSQL's binaries, for the private clusters of the migration tests (tests/support/postgres.py).
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || need+=(postgresql)
python3 -c 'import ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
# libolm's Python binding for Debian's python3: matrix-nio's encryption in the tests (tests/support/nio_e2e.py).
/usr/bin/python3 -c 'import olm' >/dev/null 2>&1 || need+=(python3-olm)
if [ ${#need[@]} -eq 0 ]; then
    # --if-allowed: the tests that need Synapse make its virtualenv themselves (tests/support/synapse.py).
    [ "$mode" = if-allowed ] || install_synapse
    exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
if [ "$mode" = if-allowed ]; then
    if ! command -v apt-get >/dev/null 2>&1 || { [ -n "$sudo" ] && ! sudo -n true 2>/dev/null; }; then
        echo "tests needing ${need[*]} will be skipped; to install them: sudo scripts/install-test-services.sh" >&2
        exit 0
    fi
    echo "installing what the tests need: ${need[*]} (scripts/install-test-services.sh)" >&2
fi
install_packages() {
    # Keep Debian's packaging from starting a system-wide slapd on port 389.
    $sudo mkdir -p /etc/ldap && $sudo touch /etc/ldap/noslapd
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    # Keep the packages' own services (a system-wide nginx on port 80) from starting.
    policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        policy=/usr/sbin/policy-rc.d
        printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
        $sudo chmod +x "$policy"
        trap '$sudo rm -f "$policy"' EXIT
    fi
    $sudo apt-get install -y -q --no-install-recommends "${need[@]}"
    [ -z "$policy" ] || $sudo rm -f "$policy"
    trap - EXIT
}
if [ "$mode" = if-allowed ]; then
    # A failure here (no network, a broken mirror, a held package) is one line, and the tests
    # run: those needing what is missing are skipped (failed when CI is set).
    log=$(mktemp "${TMPDIR:-/tmp}/install-test-services.XXXXXX")
    # Neither in an `if` nor before `||`: bash would ignore set -e inside, and go on past a
    # failed apt-get.
    set +e
    (set -e; install_packages; install_synapse) >"$log" 2>&1
    status=$?
    set -e
    if [ "$status" -ne 0 ]; then
        echo "could not install ${need[*]} ($(grep -v '^\s*$' "$log" | tail -n 1)); tests needing them will be skipped; all of it: $log" >&2
        exit 0
    fi
    rm -f "$log"
    exit 0
fi
install_packages
install_synapse
