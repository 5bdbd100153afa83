package main

// A zero-wait WaitForUpdatesEx answered at once when nothing changed.
//
// vSphere documents maxWaitSeconds=0 as "one update calculation, return at once". The simulator's
// PropertyCollector only looks at its pending updates on a 250 ms ticker, so every zero-wait poll
// costs a quarter of a second even when nothing changed (a real vCenter answers in a round trip).
// The launcher counts every change the simulator makes to its inventory (a Registry handler, like the
// collectors' own) and remembers, per session and collector, the count at the start of its last
// WaitForUpdatesEx that returned normally: that call's tick drained every update made before it
// started (a collector's very first call, without a version, starts it listening with nothing
// pending). A later zero-wait poll on the same collector, with a version and no change counted since,
// has nothing pending and gets the simulator's own "no updates" answer (no returnval) at once. Any
// change since, a first call, a waiting call or a fault goes to the simulator unchanged, so the
// updates themselves are always computed by the simulator. (A change counted between two handler
// calls of the simulator's own dispatch could in theory be missed only if that dispatch stalled for
// the whole 250 ms between a wait's start and its tick.)

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

// changeCounter counts the creations, property changes and removals the simulator dispatches.
type changeCounter struct {
	self  types.ManagedObjectReference
	count atomic.Int64
}

var changes = &changeCounter{self: types.ManagedObjectReference{Type: "ChangeCounter", Value: "change-counter"}}

func (c *changeCounter) Reference() types.ManagedObjectReference { return c.self }

func (c *changeCounter) PutObject(mo.Reference) { c.count.Add(1) }

func (c *changeCounter) UpdateObject(mo.Reference, []types.PropertyChange) { c.count.Add(1) }

func (c *changeCounter) RemoveObject(types.ManagedObjectReference) { c.count.Add(1) }

// drainedAt maps "session cookie/collector moid" to a change count: no update made before it is still
// pending on that collector.
var drainedAt = struct {
	sync.Mutex
	count map[string]int64
}{count: map[string]int64{}}

// waitsDelayed is true while a configured delay (-delay, -method-delay or the /delay hook) slows
// WaitForUpdatesEx: the at-once answer then steps aside, so clients see the delay as configured.
var waitsDelayed atomic.Bool

// noteDelays records whether cfg slows WaitForUpdatesEx; call it whenever the delays change.
func noteDelays(cfg simulator.DelayConfig) {
	waitsDelayed.Store(cfg.Delay > 0 || cfg.MethodDelay["WaitForUpdatesEx"] > 0)
}

// fastZeroWaits counts the zero-wait polls answered without the ticker (GET /control/calls shows it).
var fastZeroWaits atomic.Int64

func collectorKey(r *http.Request, this types.ManagedObjectReference) string {
	cookie, err := r.Cookie(soap.SessionCookieName)
	if err != nil {
		return ""
	}
	return cookie.Value + "/" + this.Value
}

func isZeroWait(req *types.WaitForUpdatesEx) bool {
	return req.Options != nil && req.Options.MaxWaitSeconds != nil && *req.Options.MaxWaitSeconds == 0
}

// statusRecorder passes a reply through and keeps its status code.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

// waitForUpdates serves one WaitForUpdatesEx; false when the body is not one (the caller serves it).
func (g *interceptor) waitForUpdates(w http.ResponseWriter, r *http.Request, body []byte) bool {
	method, err := simulator.UnmarshalBody(vimType, body)
	if err != nil {
		return false
	}
	req, ok := method.Body.(*types.WaitForUpdatesEx)
	if !ok {
		return false
	}
	key := collectorKey(r, method.This)
	started := changes.count.Load()
	if key != "" && req.Version != "" && isZeroWait(req) && !waitsDelayed.Load() {
		drainedAt.Lock()
		drained, seen := drainedAt.count[key]
		drainedAt.Unlock()
		if seen && drained == started && g.sessionValid(r) {
			fastZeroWaits.Add(1)
			w.Header().Set("Content-Type", "text/xml; charset=utf-8")
			w.WriteHeader(http.StatusOK)
			fmt.Fprintf(w, `%s<WaitForUpdatesExResponse xmlns="urn:vim25"></WaitForUpdatesExResponse>%s`,
				soapEnvelopeStart, soapEnvelopeEnd)
			return true
		}
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
	g.next.ServeHTTP(rec, r)
	if key != "" && rec.status == http.StatusOK {
		drainedAt.Lock()
		previous, seen := drainedAt.count[key]
		// A first call (no version) on a collector never seen starts it listening with nothing pending;
		// on one seen before it drains nothing, so it moves nothing. Concurrent waits on one collector
		// may end in any order: the highest count stays.
		if (req.Version != "" || !seen) && (!seen || started > previous) {
			drainedAt.count[key] = started
		}
		drainedAt.Unlock()
	}
	return true
}
