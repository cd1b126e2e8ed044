#!/usr/bin/env bash
# Install, from Debian's packages, what the tests need when it is missing: the servers the
# Redis and LDAP tests start privately (redis-server; slapd and ldap-utils; openssl for test
# certificates), the browser the account page tests drive (chromium, chromium-driver),
# Node.js with npm (the matrix-js-sdk client test installs its package from the npm
# registry), and curl (the README's curl sessions are run). Needs root (or sudo).
set -euo pipefail
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
if [ ${#need[@]} -eq 0 ]; then
    exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
# Keep Debian's packaging from starting a system-wide slapd on port 389.
$sudo mkdir -p /etc/ldap && $sudo touch /etc/ldap/noslapd
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -q --no-install-recommends "${need[@]}"
