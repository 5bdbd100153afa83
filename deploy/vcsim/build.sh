#!/usr/bin/env bash
# Build the simulator launcher deploy/vcsim/bin/vcsim-gw from the Go sources in this folder.
#
# Idempotent: does nothing when the binary exists and is newer than every source. Needs Go and Debian's
# govmomi sources (GOPATH mode, no network). Exits non-zero with the install command when either is missing.
# Environment: VCSIM_GOPATH (default /usr/share/gocode), VCSIM_GOCACHE (default deploy/vcsim/bin/.cache).
set -euo pipefail

case "${BASH_SOURCE[0]}" in
    */*) here="$(cd "${BASH_SOURCE[0]%/*}" && pwd)" ;;
    *) here="$(pwd)" ;;
esac
out="$here/bin/vcsim-gw"
gopath="${VCSIM_GOPATH:-/usr/share/gocode}"
install_hint="install them with: apt-get install golang-go golang-github-vmware-govmomi-dev"

up_to_date() {
    [ -x "$out" ] || return 1
    local src
    for src in "$here"/*.go "$here/build.sh"; do
        [ "$src" -nt "$out" ] && return 1
    done
    return 0
}

if up_to_date; then
    echo "vcsim-gw is up to date: $out"
    exit 0
fi

if ! command -v go >/dev/null 2>&1; then
    echo "build.sh: the Go toolchain ('go') is not installed; $install_hint" >&2
    exit 1
fi
if [ ! -d "$gopath/src/github.com/vmware/govmomi/simulator" ]; then
    echo "build.sh: govmomi sources not found under $gopath; $install_hint" >&2
    exit 1
fi

mkdir -p "$here/bin"
# Serialise concurrent builds (parallel test workers); the loser finds the binary up to date.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$here/bin/.build.lock"
    flock 9
    if up_to_date; then
        echo "vcsim-gw is up to date: $out"
        exit 0
    fi
fi

export GOPATH="$gopath" GO111MODULE=off GOFLAGS= GOPROXY=off
export GOCACHE="${VCSIM_GOCACHE:-$here/bin/.cache}"
tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT
echo "building vcsim-gw (GOPATH=$GOPATH, go $(go env GOVERSION))"
start=$(date +%s)
(cd "$here" && go build -o "$tmp" .)
mv -f "$tmp" "$out"
echo "built $out in $(( $(date +%s) - start ))s"
