package simulator

// Added to govmomi's simulator package by deploy/vcsim/build.sh (go build -overlay); it is not a package
// of its own and never builds alone.
//
// One update queue per PropertyCollector, as vCenter keeps one per session. Debian's collector registers
// itself for create/update/delete notifications with Registry.AddHandler, which keys handlers by
// reference; every session's default collector is a copy of the singleton with the singleton's
// reference, so the session whose WaitForUpdatesEx registered last received every update and the others
// none. The overlay registers a listener per collector object instead, and drops an ended session's
// listeners (logout, TerminateSession, idle expiry) so their queues stop growing.

import (
	"fmt"
	"sync/atomic"

	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/types"
)

// collectorListener feeds one collector's update queue; its key is unique per collector object.
type collectorListener struct {
	pc *PropertyCollector
}

func (l collectorListener) Reference() types.ManagedObjectReference {
	return types.ManagedObjectReference{Type: "PropertyCollector", Value: fmt.Sprintf("%s@%p", l.pc.Self.Value, l.pc)}
}

// UpdatesSilenced is a fault for tests (the control endpoint's /silence-updates): while it is set, no
// collector's queue receives the registry's changes, so every update stream stops delivering without an
// error (what the listener bug above did to all sessions but one). Results computed when a filter is
// created or read directly are unaffected.
var UpdatesSilenced atomic.Bool

func (l collectorListener) PutObject(o mo.Reference) {
	if !UpdatesSilenced.Load() {
		l.pc.PutObject(o)
	}
}

func (l collectorListener) UpdateObject(o mo.Reference, changes []types.PropertyChange) {
	if !UpdatesSilenced.Load() {
		l.pc.UpdateObject(o, changes)
	}
}

func (l collectorListener) RemoveObject(ref types.ManagedObjectReference) {
	if !UpdatesSilenced.Load() {
		l.pc.RemoveObject(ref)
	}
}

// sessionListener is what WaitForUpdatesEx and DestroyPropertyCollector register and remove (patched
// calls in property_collector.go).
func sessionListener(pc *PropertyCollector) RegisterObject {
	return collectorListener{pc}
}

// UpdateListeners returns how many collectors currently receive the registry's updates.
func UpdateListeners() int {
	Map.m.Lock()
	defer Map.m.Unlock()
	n := 0
	for _, h := range Map.handlers {
		if _, ok := h.(collectorListener); ok {
			n++
		}
	}
	return n
}

// delSession ends a session (Debian's version is renamed delSessionDebian by build.sh). When no other
// session shares its object registry (a clone ticket does until it is used), its collectors and
// container views stop listening. Its paged results and truncated update replies waiting for a
// continuation are dropped.
func (m *SessionManager) delSession(id string) {
	sessionMutex.Lock()
	ended, ok := m.sessions[id]
	delete(m.sessions, id)
	shared := false
	for _, s := range m.sessions {
		shared = shared || s.Registry == ended.Registry
	}
	sessionMutex.Unlock()
	dropSessionResults(id) // overlay/paging.go
	if ok && !shared && ended.Registry != nil {
		stopListening(ended.Registry)
	}
}

func stopListening(r *Registry) {
	r.m.Lock()
	objects := make([]mo.Reference, 0, len(r.objects))
	for _, o := range r.objects {
		objects = append(objects, o)
	}
	r.m.Unlock()
	for _, o := range objects {
		switch x := o.(type) {
		case *PropertyCollector:
			Map.RemoveHandler(sessionListener(x))
			dropPendingUpdates(x) // overlay/updates.go
		case *ContainerView:
			Map.RemoveHandler(x)
		}
	}
}
