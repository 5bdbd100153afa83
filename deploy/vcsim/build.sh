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
# One change to govmomi's simulator, applied through a build overlay (Debian's sources stay untouched):
# vSphere answers WaitForUpdatesEx with maxWaitSeconds=0 after one update calculation, at once; the
# simulator makes that calculation only at its first 250 ms tick. The patched collector makes it at once.
collector="$GOPATH/src/github.com/vmware/govmomi/simulator/property_collector.go"
overlay="$here/bin/.overlay"
mkdir -p "$overlay"
# ZeroWaitsAtOnce counts those calls (the control endpoint's /inflight reports it).
sed -e 's|^\(\t*\)defer ticker.Stop()$|&\n\1tick := ticker.C\n\1if oneUpdate { // one calculation, at once (vcsim-gw build overlay)\n\1\tZeroWaitsAtOnce.Add(1)\n\1\tnow := make(chan time.Time, 1)\n\1\tnow <- time.Now()\n\1\ttick = now\n\1}|' \
    -e 's|case <-ticker.C:|case <-tick:|' \
    -e 's|^\t"sync"$|&\n\t"sync/atomic"|' "$collector" >"$overlay/property_collector.go"
printf '\n// ZeroWaitsAtOnce counts WaitForUpdatesEx calls with maxWaitSeconds=0 (vcsim-gw build overlay).\nvar ZeroWaitsAtOnce atomic.Int64\n' \
    >>"$overlay/property_collector.go"
if [ "$(grep -c -e '^\s*tick := ticker.C$' -e 'case <-tick:' -e '^\s"sync/atomic"$' "$overlay/property_collector.go")" != 3 ]; then
    echo "build.sh: $collector is not the version the zero-wait patch expects (govmomi 0.24)" >&2
    exit 1
fi
printf '{"Replace": {"%s": "%s"}}\n' "$collector" "$overlay/property_collector.go" >"$overlay/overlay.json"
echo "building vcsim-gw (GOPATH=$GOPATH, go $(go env GOVERSION))"
start=$(date +%s)
(cd "$here" && go build -overlay "$overlay/overlay.json" -o "$tmp" .)
mv -f "$tmp" "$out"
echo "built $out in $(( $(date +%s) - start ))s"
