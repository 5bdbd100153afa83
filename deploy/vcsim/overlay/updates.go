package simulator

// Added to govmomi's simulator package by deploy/vcsim/build.sh (go build -overlay).
//
// vCenter bounds one WaitForUpdatesEx reply by WaitOptions.maxObjectUpdates: a reply with more object
// updates than that returns the first maxObjectUpdates with truncated=true and a version, and
// WaitForUpdatesEx(that version) returns the next part at once (whatever maxWaitSeconds says), until a
// part that is not truncated carries the version that waits for changes. Debian's simulator ignores
// maxObjectUpdates. The overlay keeps the rest of a truncated reply per collector; a client that never
// asks gets every update in one reply as before. Asking with another version drops the rest (the client
// started over); the end of the collector's session drops it too (overlay/listeners.go).

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

type pendingUpdates struct {
	version string // the truncated reply's version, which continues
	next    string // the version of the whole reply, given with its last part
	filters []types.PropertyFilterUpdate
}

var (
	updatesMu      sync.Mutex
	updatesOf      = map[*PropertyCollector]*pendingUpdates{}
	updatesCounter atomic.Int64
)

// PendingUpdateParts returns how many collectors hold the rest of a truncated WaitForUpdatesEx reply.
func PendingUpdateParts() int {
	updatesMu.Lock()
	defer updatesMu.Unlock()
	return len(updatesOf)
}

func dropPendingUpdates(pc *PropertyCollector) {
	updatesMu.Lock()
	delete(updatesOf, pc)
	updatesMu.Unlock()
}

// WaitForUpdatesEx is Debian's (renamed waitForUpdatesExDebian by build.sh), bounded by maxObjectUpdates.
func (pc *PropertyCollector) WaitForUpdatesEx(ctx *Context, r *types.WaitForUpdatesEx) soap.HasFault {
	max := 0
	if r.Options != nil {
		max = int(r.Options.MaxObjectUpdates)
	}
	updatesMu.Lock()
	p := updatesOf[pc]
	delete(updatesOf, pc)
	updatesMu.Unlock()
	if p != nil && p.version == r.Version {
		return &methods.WaitForUpdatesExBody{
			Res: &types.WaitForUpdatesExResponse{Returnval: pc.nextUpdates(p.filters, max, p.next)},
		}
	}
	res := pc.waitForUpdatesExDebian(ctx, r)
	body, ok := res.(*methods.WaitForUpdatesExBody)
	if !ok || body.Res == nil || body.Res.Returnval == nil {
		return res
	}
	body.Res.Returnval = pc.nextUpdates(body.Res.Returnval.FilterSet, max, body.Res.Returnval.Version)
	return body
}

// nextUpdates cuts at most max object updates off filters; what remains is kept for this collector
// under the truncated part's version.
func (pc *PropertyCollector) nextUpdates(filters []types.PropertyFilterUpdate, max int, next string) *types.UpdateSet {
	count := 0
	for _, f := range filters {
		count += len(f.ObjectSet)
	}
	if max <= 0 || count <= max {
		return &types.UpdateSet{Version: next, FilterSet: filters}
	}
	var part []types.PropertyFilterUpdate
	rest, left := filters, max
	for left > 0 {
		f := rest[0]
		if len(f.ObjectSet) <= left {
			part = append(part, f)
			left -= len(f.ObjectSet)
			rest = rest[1:]
			continue
		}
		part = append(part, types.PropertyFilterUpdate{Filter: f.Filter, ObjectSet: f.ObjectSet[:left]})
		rest = append([]types.PropertyFilterUpdate{{Filter: f.Filter, ObjectSet: f.ObjectSet[left:],
			MissingSet: f.MissingSet}}, rest[1:]...)
		left = 0
	}
	version := fmt.Sprintf("%s.part%d", next, updatesCounter.Add(1))
	updatesMu.Lock()
	updatesOf[pc] = &pendingUpdates{version: version, next: next, filters: rest}
	updatesMu.Unlock()
	return &types.UpdateSet{Version: version, FilterSet: part, Truncated: types.NewBool(true)}
}
