#!/usr/bin/env bash
# The one place that knows which Debian packages the project needs, in two sets:
#
#   run   what `make run` (the demo) needs: the simulator's Go toolchain and govmomi sources,
#         python3-venv for .venv, make for the README's commands.
#   test  everything (the default; `make test`, `make lint`, .ci/run): the run set, plus Go's
#         sumdb/tlog and sumdb/note (the audit proofs' second implementation); headless Chromium for
#         the web page tests; nginx and systemd for the deploy recipes; buildah and mmdebstrap for the
#         container image; PostgreSQL for the store tests; rsyslog with its TLS driver for the syslog
#         forwarder's tests; Node.js and npm for the identity tests' OpenID provider; Prometheus for
#         promtool, which checks the alert rules in deploy/prometheus/.
#
#   bash deploy/bootstrap.sh [run|test]           install what is missing (as root), or print the one
#                                                 sudo line and stop
#   bash deploy/bootstrap.sh --check [run|test]   report what is missing; exit 1 if anything is
#   bash deploy/bootstrap.sh --list [run|test]    print the set's packages, one per line
#
# While installing, apt's output goes to a log file ($BOOTSTRAP_LOG, default build/bootstrap.log)
# and the terminal gets one line per step (its last lines and the log's path when a step fails).
set -euo pipefail

RUN_PACKAGES=(
    golang-go golang-github-vmware-govmomi-dev
    python3-venv make
)
TEST_PACKAGES=(
    "${RUN_PACKAGES[@]}"
    golang-golang-x-mod-dev
    chromium fonts-dejavu-core
    nginx-light systemd
    buildah mmdebstrap
    postgresql
    rsyslog rsyslog-gnutls
    nodejs
    prometheus
)

usage() { echo "usage: bash deploy/bootstrap.sh [--check|--list] [run|test]" >&2; exit 2; }

mode=install
set_name=test
for arg in "$@"; do
    case "$arg" in
        --check|--list) mode="$arg" ;;
        run|test) set_name="$arg" ;;
        *) usage ;;
    esac
done
if [ "$set_name" = run ]; then PACKAGES=("${RUN_PACKAGES[@]}"); else PACKAGES=("${TEST_PACKAGES[@]}"); fi

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
if [ "$set_name" = test ]; then
    command -v npm >/dev/null 2>&1 || missing+=(npm)
fi

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

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
log="${BOOTSTRAP_LOG:-$repo/build/bootstrap.log}"
mkdir -p "$(dirname "$log")"
: > "$log"

step() {  # step WHAT COMMAND...: one line on the terminal, the command's output in the log
    local what="$1"
    shift
    echo "bootstrap: $what" >&2
    if ! "$@" >>"$log" 2>&1; then
        echo "bootstrap: $what failed; the last lines of $log:" >&2
        tail -n 20 "$log" >&2
        exit 1
    fi
}

echo "bootstrap: installing ${#missing[@]} package(s) for '$set_name' (apt's output: $log)" >&2
export DEBIAN_FRONTEND=noninteractive
step "apt-get update" apt-get update -qq
step "apt-get install ${missing[*]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "bootstrap: done" >&2
