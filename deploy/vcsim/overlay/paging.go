package simulator

// Added to govmomi's simulator package by deploy/vcsim/build.sh (go build -overlay).
//
// vCenter pages a large retrieval: RetrievePropertiesEx returns at most RetrieveOptions.maxObjects
// objects and a token, ContinueRetrievePropertiesEx(token) the next page (and a token while more remain),
// CancelRetrievePropertiesEx(token) drops the rest. Debian's simulator ignores maxObjects and has
// neither method. vCenter's own policy may cut a page shorter, maxObjects or not: PageLimit (the
// control endpoint's /page-limit) plays that policy, so a client that does not follow tokens is caught. The overlay keeps the objects past the first page under a token of the session that
// asked; a token of another session, an unknown or a used one is refused as vCenter does (InvalidArgument
// on the token). The session's end drops its outstanding results (overlay/listeners.go).

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

type pendingResult struct {
	session string
	max     int
	objects []types.ObjectContent
}

// PageLimit is the most objects any page holds, whatever maxObjects asks (0: no limit of its own).
var PageLimit atomic.Int32

var (
	pendingMu      sync.Mutex
	pending        = map[string]*pendingResult{}
	pendingCounter atomic.Int64
)

// PendingRetrievals returns how many paged results wait for ContinueRetrievePropertiesEx.
func PendingRetrievals() int {
	pendingMu.Lock()
	defer pendingMu.Unlock()
	return len(pending)
}

func sessionKey(ctx *Context) string {
	if ctx.Session == nil {
		return ""
	}
	return ctx.Session.Key
}

// nextPage cuts at most max objects (and at most PageLimit) off objects; what remains is kept under a
// new token.
func nextPage(ctx *Context, objects []types.ObjectContent, max int) *types.RetrieveResult {
	if limit := int(PageLimit.Load()); limit > 0 && (max <= 0 || limit < max) {
		max = limit
	}
	if max <= 0 || len(objects) <= max {
		return &types.RetrieveResult{Objects: objects}
	}
	token := fmt.Sprintf("%d", pendingCounter.Add(1))
	pendingMu.Lock()
	pending[token] = &pendingResult{session: sessionKey(ctx), max: max, objects: objects[max:]}
	pendingMu.Unlock()
	return &types.RetrieveResult{Token: token, Objects: objects[:max]}
}

func takePending(ctx *Context, token string) (*pendingResult, *soap.Fault) {
	pendingMu.Lock()
	defer pendingMu.Unlock()
	p, ok := pending[token]
	if !ok || p.session != sessionKey(ctx) {
		return nil, Fault("", &types.InvalidArgument{InvalidProperty: "token"})
	}
	delete(pending, token)
	return p, nil
}

func dropSessionResults(session string) {
	pendingMu.Lock()
	defer pendingMu.Unlock()
	for token, p := range pending {
		if p.session == session {
			delete(pending, token)
		}
	}
}

// RetrievePropertiesEx is Debian's (renamed retrievePropertiesExDebian by build.sh), paged by maxObjects.
func (pc *PropertyCollector) RetrievePropertiesEx(ctx *Context, r *types.RetrievePropertiesEx) soap.HasFault {
	body := pc.retrievePropertiesExDebian(ctx, r).(*methods.RetrievePropertiesExBody)
	if body.Res != nil && body.Res.Returnval != nil {
		body.Res.Returnval = nextPage(ctx, body.Res.Returnval.Objects, int(r.Options.MaxObjects))
	}
	return body
}

func (pc *PropertyCollector) ContinueRetrievePropertiesEx(ctx *Context, r *types.ContinueRetrievePropertiesEx) soap.HasFault {
	body := &methods.ContinueRetrievePropertiesExBody{}
	p, fault := takePending(ctx, r.Token)
	if fault != nil {
		body.Fault_ = fault
		return body
	}
	body.Res = &types.ContinueRetrievePropertiesExResponse{Returnval: *nextPage(ctx, p.objects, p.max)}
	return body
}

func (pc *PropertyCollector) CancelRetrievePropertiesEx(ctx *Context, r *types.CancelRetrievePropertiesEx) soap.HasFault {
	body := &methods.CancelRetrievePropertiesExBody{}
	if _, fault := takePending(ctx, r.Token); fault != nil {
		body.Fault_ = fault
		return body
	}
	body.Res = &types.CancelRetrievePropertiesExResponse{}
	return body
}
