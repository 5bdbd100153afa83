#!/usr/bin/env bash
# The one place that knows which Debian packages the project needs: the simulator's Go toolchain and
# govmomi sources; Go's sumdb/tlog and sumdb/note (the audit proofs' second implementation); headless
# Chromium for the web page tests; nginx and systemd for the deploy recipes; buildah and mmdebstrap
# for the container image; PostgreSQL for the store tests; rsyslog with its TLS driver for the syslog
# forwarder's tests; Node.js and npm for the identity tests' OpenID provider; python3-venv for .venv;
# make for the README's commands. `make run`, `make test` and `.ci/run` all start with it.
#
#   bash deploy/bootstrap.sh           install what is missing (as root), or print the one sudo line
#   bash deploy/bootstrap.sh --check   report what is missing; exit 1 if anything is, install nothing
#   bash deploy/bootstrap.sh --list    print the package list, one per line
set -euo pipefail

PACKAGES=(
    golang-go golang-github-vmware-govmomi-dev
    golang-golang-x-mod-dev
    chromium fonts-dejavu-core
    nginx-light systemd
    buildah mmdebstrap
    postgresql
    rsyslog rsyslog-gnutls
    python3-venv make
    nodejs
)

mode="${1:-install}"
case "$mode" in
    install|--check|--list) ;;
    *) echo "usage: bash deploy/bootstrap.sh [--check|--list]" >&2; exit 2 ;;
esac

if [ "$mode" = "--list" ]; then
    printf '%s\n' "${PACKAGES[@]}"
    exit 0
fi

if ! command -v dpkg >/dev/null 2>&1; then
    echo "bootstrap: not a Debian-family machine (no dpkg); install the equivalents of: ${PACKAGES[*]}" >&2
    [ "$mode" = "--check" ] && exit 1
    exit 0
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
# npm for the identity tests' OpenID provider (tests/oidc); a nodejs build that bundles it provides it
command -v npm >/dev/null 2>&1 || missing+=(npm)

if [ "${#missing[@]}" -eq 0 ]; then
    [ "$mode" = "--check" ] && echo "bootstrap: every package is installed (${PACKAGES[*]})"
    exit 0
fi

if [ "$mode" = "--check" ]; then
    echo "bootstrap: missing Debian packages: ${missing[*]}"
    exit 1
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "bootstrap: missing Debian packages; install them, then run the same command again: sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
    exit 1
fi

echo "bootstrap: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
