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
    for src in "$here"/*.go "$here"/overlay/*.go "$here/build.sh"; do
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
# govmomi's simulator is changed where it is not vCenter, through a build overlay (Debian's sources stay
# untouched): copies of four of its files, patched with sed below (each patch checked, so a different
# govmomi version stops the build with a message), plus the files in overlay/ added to its package.
sim="$GOPATH/src/github.com/vmware/govmomi/simulator"
overlay="$here/bin/.overlay"
mkdir -p "$overlay"
replace=()

# patch_copy FILE EXPECTED SED-ARGS...: copy $sim/FILE to the overlay through sed; EXPECTED is "PATTERN=COUNT ..."
# (grep -c of each fixed string in the result), checked so a patch that matched nothing fails the build.
patch_copy() {
    local file=$1 expected=$2 check pattern count
    shift 2
    sed "$@" "$sim/$file" >"$overlay/$file"
    for check in $expected; do
        pattern=${check%=*} count=${check##*=}
        pattern=${pattern//@/ }
        if [ "$(grep -cF -e "$pattern" "$overlay/$file")" != "$count" ]; then
            echo "build.sh: $sim/$file is not the version the overlay expects (govmomi 0.24): '$pattern'" >&2
            exit 1
        fi
    done
    replace+=("$sim/$file" "$overlay/$file")
}

# property_collector.go:
# - vSphere answers WaitForUpdatesEx with maxWaitSeconds=0 after one update calculation, at once; the
#   simulator makes it at its first 250 ms tick. The patched collector makes it at once and counts those
#   calls in ZeroWaitsAtOnce (the control endpoint's /inflight reports it).
# - A collector listens for changes under a key of its own (overlay/listeners.go), registered before its
#   first state is read; DestroyPropertyCollector stops it.
# - The collector looks for objects newly in its filters (a whole retrieval of every filter) once per batch
#   of updates, not once per update and filter: with every session's updates delivered (listeners above),
#   one batch of a few changes re-read 30,000 VMs several times over (a zero-wait poll took 1.2 s).
# - RetrievePropertiesEx pages by RetrieveOptions.maxObjects, continued and cancelled by token, as vCenter
#   does (overlay/paging.go wraps the renamed function).
# - WaitForUpdatesEx bounds a reply by WaitOptions.maxObjectUpdates, truncated and continued by version,
#   as vCenter does (overlay/updates.go wraps the renamed function).
patch_copy property_collector.go \
    "retrievePropertiesExDebian(ctx=1 waitForUpdatesExDebian(ctx=1 tick@:=@ticker.C=1 case@<-tick:=1 sync/atomic=1 AddHandler(sessionListener(pc))=1 RemoveHandler(sessionListener(pc))=1 AddHandler(pc)=0 if@!applyOnce()=2 applied@:=@false=1" \
    -e 's|^\(\t*\)pc.updates = nil // clear updates collected by the managed object CRUD listeners$|&\n\1applied := false // vcsim-gw overlay: new objects are looked for once per batch\n\1applyOnce := func() bool {\n\1\tif applied {\n\1\t\treturn true\n\1\t}\n\1\tapplied = true\n\1\treturn apply()\n\1}|' \
    -e 's|if !apply() {|if !applyOnce() {|' \
    -e 's|^\(\t*\)defer ticker.Stop()$|&\n\1tick := ticker.C\n\1if oneUpdate { // one calculation, at once (vcsim-gw build overlay)\n\1\tZeroWaitsAtOnce.Add(1)\n\1\tnow := make(chan time.Time, 1)\n\1\tnow <- time.Now()\n\1\ttick = now\n\1}|' \
    -e 's|case <-ticker.C:|case <-tick:|' \
    -e 's|^\t"sync"$|&\n\t"sync/atomic"|' \
    -e 's|^\(\t*\)apply() *// Collect current state$|\1ctx.Map.AddHandler(sessionListener(pc)) // vcsim-gw overlay: this collector, from now on\n&|' \
    -e '/^\t*ctx.Map.AddHandler(pc) *\/\/ Listen for create, update, delete/d' \
    -e 's|^\(\t*\)ctx.Map.Remove(c.This)$|&\n\1ctx.Map.RemoveHandler(sessionListener(pc)) // vcsim-gw overlay|' \
    -e 's|^func (pc \*PropertyCollector) RetrievePropertiesEx(ctx|func (pc *PropertyCollector) retrievePropertiesExDebian(ctx|' \
    -e 's|^func (pc \*PropertyCollector) WaitForUpdatesEx(ctx|func (pc *PropertyCollector) waitForUpdatesExDebian(ctx|'
printf '\n// ZeroWaitsAtOnce counts WaitForUpdatesEx calls with maxWaitSeconds=0 (vcsim-gw build overlay).\nvar ZeroWaitsAtOnce atomic.Int64\n' \
    >>"$overlay/property_collector.go"
# Ending a session stops its collectors and views (overlay/listeners.go wraps the renamed function).
patch_copy session_manager.go "delSessionDebian(id@string)=1" \
    -e 's|^func (m \*SessionManager) delSession(id string) {$|func (m *SessionManager) delSessionDebian(id string) {|'
# MoveIntoFolder moves in place and ReconfigVM reports what it changed (overlay/changes.go).
patch_copy folder.go "moveIntoFolderTaskDebian(=1" \
    -e 's|^func (f \*Folder) MoveIntoFolderTask(|func (f *Folder) moveIntoFolderTaskDebian(|'
patch_copy virtual_machine.go "configureDebian(spec=1" \
    -e 's|^func (vm \*VirtualMachine) configure(spec|func (vm *VirtualMachine) configureDebian(spec|'
for added in "$here"/overlay/*.go; do
    replace+=("$sim/vcsim_gw_${added##*/}" "$added")
done
{
    printf '{"Replace": {'
    for ((i = 0; i < ${#replace[@]}; i += 2)); do
        [ "$i" = 0 ] || printf ', '
        printf '"%s": "%s"' "${replace[i]}" "${replace[i + 1]}"
    done
    printf '}}\n'
} >"$overlay/overlay.json"
echo "building vcsim-gw (GOPATH=$GOPATH, go $(go env GOVERSION))"
start=$(date +%s)
(cd "$here" && go build -overlay "$overlay/overlay.json" -o "$tmp" .)
mv -f "$tmp" "$out"
echo "built $out in $(( $(date +%s) - start ))s"
