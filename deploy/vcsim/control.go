package main

// The control endpoint: plain HTTP + JSON on a loopback address, for tests only. It changes simulator
// state that no SOAP method can (connection states, delays, injected faults, slow tasks, session kills).

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/vmware/govmomi"
	"github.com/vmware/govmomi/property"
	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/types"
)

type controller struct {
	model   *simulator.Model
	gate    *interceptor
	admin   *adminClient
	options *options
}

// httpError is an error with the HTTP status it answers with.
type httpError struct {
	status  int
	message string
}

func (e *httpError) Error() string { return e.message }

func badRequest(format string, args ...interface{}) error {
	return &httpError{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

type route struct {
	method  string
	handler func(c *controller, body []byte) (interface{}, error)
}

var routes = map[string]route{
	"/health":                {http.MethodGet, (*controller).health},
	"/inventory":             {http.MethodGet, (*controller).inventory},
	"/rules":                 {http.MethodGet, (*controller).rules},
	"/inflight":              {http.MethodGet, (*controller).inflight},
	"/vm/connection-state":   {http.MethodPost, (*controller).vmConnectionState},
	"/host/connection-state": {http.MethodPost, (*controller).hostConnectionState},
	"/delay":                 {http.MethodPost, (*controller).delay},
	"/slow-task":             {http.MethodPost, (*controller).slowTask},
	"/fail-next":             {http.MethodPost, (*controller).failNext},
	"/silence-updates":       {http.MethodPost, (*controller).silenceUpdates},
	"/status-next":           {http.MethodPost, (*controller).statusNext},
	"/terminate-sessions":    {http.MethodPost, (*controller).terminateSessions},
	"/reset":                 {http.MethodPost, (*controller).reset},
	"/gc":                    {http.MethodPost, (*controller).collectGarbage},
	"/page-limit":            {http.MethodPost, (*controller).pageLimit},
}

type controlServer struct {
	Addr   string
	server *http.Server
}

func (s *controlServer) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = s.server.Shutdown(ctx)
}

// startControl listens on addr, which must be a loopback address: the endpoint has no authentication.
func startControl(addr string, c *controller) (*controlServer, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("-control: %v", err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("-control must be a loopback address (it is unauthenticated), got %q", addr)
	}
	listener, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-control: %v", err)
	}
	server := &http.Server{Handler: c, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = server.Serve(listener) }()
	return &controlServer{Addr: listener.Addr().String(), server: server}, nil
}

func (c *controller) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rt, ok := routes[r.URL.Path]
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such control path: " + r.URL.Path})
		return
	}
	if r.Method != rt.method {
		writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "use " + rt.method})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	result, err := rt.handler(c, body)
	if err != nil {
		status := http.StatusInternalServerError
		if he, ok := err.(*httpError); ok {
			status = he.status
		}
		log.Printf("control %s: %v", r.URL.Path, err)
		writeJSON(w, status, map[string]string{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, result)
}

func writeJSON(w http.ResponseWriter, status int, value interface{}) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(value)
}

// decodeStrict unmarshals body into v, refusing unknown fields so a typo in a test fails loudly.
func decodeStrict(body []byte, v interface{}) error {
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return badRequest("invalid JSON payload: %v", err)
	}
	return nil
}

func (c *controller) health(_ []byte) (interface{}, error) {
	return map[string]interface{}{
		"ok": true, "model": c.options.model, "url": c.admin.publicURL(), "instance_uuid": c.options.instanceUUID,
	}, nil
}

// inventoryKinds are the entity types /inventory lists, under these keys.
var inventoryKinds = map[string]string{
	"datacenters": "Datacenter", "clusters": "ClusterComputeResource", "hosts": "HostSystem",
	"vms": "VirtualMachine", "datastores": "Datastore", "pools": "ResourcePool", "networks": "Network",
	"portgroups": "DistributedVirtualPortgroup",
}

type inventoryItem struct {
	Name            string `json:"name"`
	Moid            string `json:"moid"`
	PowerState      string `json:"power_state,omitempty"`
	ConnectionState string `json:"connection_state,omitempty"`
}

func (c *controller) inventory(_ []byte) (interface{}, error) {
	out := map[string][]inventoryItem{}
	for key, kind := range inventoryKinds {
		items := []inventoryItem{}
		for _, e := range simulator.Map.All(kind) {
			items = append(items, describe(e))
		}
		sort.Slice(items, func(i, j int) bool { return items[i].Name < items[j].Name })
		out[key] = items
	}
	return out, nil
}

func describe(e mo.Entity) inventoryItem {
	item := inventoryItem{Name: e.Entity().Name, Moid: e.Reference().Value}
	simulator.Map.WithLock(e, func() {
		switch x := e.(type) {
		case *simulator.VirtualMachine:
			item.PowerState = string(x.Runtime.PowerState)
			item.ConnectionState = string(x.Runtime.ConnectionState)
		case *simulator.HostSystem:
			item.PowerState = string(x.Runtime.PowerState)
			item.ConnectionState = string(x.Runtime.ConnectionState)
		}
	})
	return item
}

func (c *controller) inflight(_ []byte) (interface{}, error) {
	// zero_waits_at_once: WaitForUpdatesEx calls with maxWaitSeconds=0 computed at once (build.sh's overlay);
	// update_listeners: collectors receiving the simulator's changes (one per collector that waited);
	// pending_retrievals: paged results waiting for ContinueRetrievePropertiesEx (overlay/paging.go)
	// pending_update_parts: collectors holding the rest of a truncated WaitForUpdatesEx (overlay/updates.go)
	return map[string]interface{}{
		"calls": c.gate.calls(), "zero_waits_at_once": simulator.ZeroWaitsAtOnce.Load(),
		"update_listeners": simulator.UpdateListeners(), "pending_retrievals": simulator.PendingRetrievals(),
		"pending_update_parts": simulator.PendingUpdateParts(),
	}, nil
}

// pageLimit sets the most objects a RetrievePropertiesEx page holds, maxObjects or not (vCenter's own
// policy); 0 removes the limit.
func (c *controller) pageLimit(body []byte) (interface{}, error) {
	var req struct {
		MaxObjects *int32 `json:"max_objects"`
	}
	if err := json.Unmarshal(body, &req); err != nil || req.MaxObjects == nil || *req.MaxObjects < 0 {
		return nil, badRequest("send {\"max_objects\": N}, N >= 0 (0: no limit)")
	}
	simulator.PageLimit.Store(*req.MaxObjects)
	return map[string]interface{}{"max_objects": *req.MaxObjects}, nil
}

// collectGarbage runs a full collection now, so a benchmark's next timed call does not pay for the
// garbage an earlier one left (the simulator and the gateway share the machine's cores).
func (c *controller) collectGarbage(_ []byte) (interface{}, error) {
	runtime.GC()
	var stats runtime.MemStats
	runtime.ReadMemStats(&stats)
	return map[string]interface{}{"heap_alloc_bytes": stats.HeapAlloc, "collections": stats.NumGC}, nil
}

func (c *controller) rules(_ []byte) (interface{}, error) {
	return c.gate.rules(), nil
}

// findEntity finds an entity of the given type by moid or name.
func findEntity(kind, label string) (mo.Entity, error) {
	if label == "" {
		return nil, badRequest("name the %s (its name or moid)", kind)
	}
	if e, ok := simulator.Map.Get(types.ManagedObjectReference{Type: kind, Value: label}).(mo.Entity); ok {
		return e, nil
	}
	for _, e := range simulator.Map.All(kind) {
		if e.Entity().Name == label {
			return e, nil
		}
	}
	return nil, &httpError{http.StatusNotFound, fmt.Sprintf("no %s named or with moid %q", kind, label)}
}

var vmConnectionStates = map[string]types.VirtualMachineConnectionState{
	"connected":    types.VirtualMachineConnectionStateConnected,
	"disconnected": types.VirtualMachineConnectionStateDisconnected,
	"orphaned":     types.VirtualMachineConnectionStateOrphaned,
	"inaccessible": types.VirtualMachineConnectionStateInaccessible,
	"invalid":      types.VirtualMachineConnectionStateInvalid,
}

var hostConnectionStates = map[string]types.HostSystemConnectionState{
	"connected":     types.HostSystemConnectionStateConnected,
	"disconnected":  types.HostSystemConnectionStateDisconnected,
	"notResponding": types.HostSystemConnectionStateNotResponding,
}

func (c *controller) vmConnectionState(body []byte) (interface{}, error) {
	var req struct {
		VM    string `json:"vm"`
		State string `json:"state"`
	}
	if err := decodeStrict(body, &req); err != nil {
		return nil, err
	}
	state, ok := vmConnectionStates[req.State]
	if !ok {
		return nil, badRequest("state must be one of connected, disconnected, orphaned, inaccessible, invalid")
	}
	vm, err := findEntity("VirtualMachine", req.VM)
	if err != nil {
		return nil, err
	}
	setConnectionState(vm, state)
	return map[string]string{"vm": vm.Entity().Name, "moid": vm.Reference().Value, "state": string(state)}, nil
}

func (c *controller) hostConnectionState(body []byte) (interface{}, error) {
	var req struct {
		Host  string `json:"host"`
		State string `json:"state"`
	}
	if err := decodeStrict(body, &req); err != nil {
		return nil, err
	}
	state, ok := hostConnectionStates[req.State]
	if !ok {
		return nil, badRequest("state must be one of connected, disconnected, notResponding")
	}
	host, err := findEntity("HostSystem", req.Host)
	if err != nil {
		return nil, err
	}
	setConnectionState(host, state)
	return map[string]string{"host": host.Entity().Name, "moid": host.Reference().Value, "state": string(state)}, nil
}

// setConnectionState updates runtime and summary so every property path a client may read agrees.
func setConnectionState(e mo.Entity, state interface{}) {
	updateLocked(e, []types.PropertyChange{
		{Name: "runtime.connectionState", Val: state},
		{Name: "summary.runtime.connectionState", Val: state},
	})
}

type delayView struct {
	Delay       int            `json:"delay"`
	MethodDelay map[string]int `json:"method_delay"`
	Jitter      float64        `json:"jitter"`
}

// delay replaces the fields given; the method map is swapped whole, never mutated, because the
// simulator reads it from concurrent request goroutines.
func (c *controller) delay(body []byte) (interface{}, error) {
	var req struct {
		Delay       *int            `json:"delay"`
		MethodDelay *map[string]int `json:"method_delay"`
		Jitter      *float64        `json:"jitter"`
	}
	if err := decodeStrict(body, &req); err != nil {
		return nil, err
	}
	cfg := &c.model.DelayConfig
	if req.Delay != nil {
		if *req.Delay < 0 {
			return nil, badRequest("delay must not be negative")
		}
		cfg.Delay = *req.Delay
	}
	if req.MethodDelay != nil {
		fresh := map[string]int{}
		for k, v := range *req.MethodDelay {
			if v < 0 {
				return nil, badRequest("method_delay[%s] must not be negative", k)
			}
			fresh[k] = v
		}
		cfg.MethodDelay = fresh
	}
	if req.Jitter != nil {
		cfg.DelayJitter = *req.Jitter
	}
	return delayView{cfg.Delay, cfg.MethodDelay, cfg.DelayJitter}, nil
}

func (c *controller) slowTask(body []byte) (interface{}, error) {
	var r rule
	if err := decodeStrict(body, &r); err != nil {
		return nil, err
	}
	if !strings.HasSuffix(r.Method, taskSuffix) {
		return nil, badRequest("method must be a task method (ending in %s), got %q", taskSuffix, r.Method)
	}
	if r.Fault != "" || r.Message != "" || r.Count < 0 {
		return nil, badRequest("slow-task takes method, seconds, optional entity and count (>= 0)")
	}
	c.gate.setSlow(r)
	return c.gate.rules(), nil
}

// silenceUpdates is a fault: {"silenced": true} makes every update stream stop delivering, silently, until
// {"silenced": false} (a stream that a real target broke without an error).
func (c *controller) silenceUpdates(body []byte) (interface{}, error) {
	var req struct {
		Silenced bool `json:"silenced"`
	}
	if err := decodeStrict(body, &req); err != nil {
		return nil, err
	}
	simulator.UpdatesSilenced.Store(req.Silenced)
	return map[string]bool{"silenced": req.Silenced}, nil
}

func (c *controller) failNext(body []byte) (interface{}, error) {
	r := rule{Count: 1}
	if err := decodeStrict(body, &r); err != nil {
		return nil, err
	}
	if r.Method == "" || r.Seconds != 0 || r.Count < 1 {
		return nil, badRequest("fail-next takes method, optional entity, fault, message and count (>= 1)")
	}
	if _, err := newFault(r.Fault); err != nil {
		return nil, badRequest("%v", err)
	}
	c.gate.addFail(r)
	return c.gate.rules(), nil
}

func (c *controller) statusNext(body []byte) (interface{}, error) {
	var req struct {
		Status int `json:"status"`
	}
	if err := decodeStrict(body, &req); err != nil {
		return nil, err
	}
	if req.Status < 200 || req.Status > 599 {
		return nil, badRequest("status must be an HTTP status code")
	}
	simulator.StatusSDK = req.Status
	return map[string]int{"status": req.Status}, nil
}

func (c *controller) terminateSessions(_ []byte) (interface{}, error) {
	n, err := c.admin.terminateAll()
	if err != nil {
		return nil, err
	}
	return map[string]int{"terminated": n}, nil
}

func (c *controller) reset(_ []byte) (interface{}, error) {
	c.gate.reset()
	c.model.DelayConfig.Delay = 0
	c.model.DelayConfig.MethodDelay = map[string]int{}
	c.model.DelayConfig.DelayJitter = 0
	simulator.StatusSDK = http.StatusOK
	simulator.PageLimit.Store(0)
	return map[string]bool{"ok": true}, nil
}

// adminClient logs into the simulator like any client to use SOAP-only operations.
type adminClient struct {
	url url.URL // with the login credentials
}

func (a *adminClient) publicURL() string {
	u := a.url
	u.User = nil
	return u.String()
}

// withSession runs f with the cookie value of a fresh session of the launcher's own, then logs out.
func (a *adminClient) withSession(f func(key string)) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, err := govmomi.NewClient(ctx, &a.url, true)
	if err != nil {
		return fmt.Errorf("admin login: %v", err)
	}
	defer func() { _ = client.Logout(ctx) }()
	session, err := client.SessionManager.UserSession(ctx)
	if err != nil || session == nil {
		return fmt.Errorf("admin session: %v", err)
	}
	f(session.Key)
	return nil
}

// terminateAll ends every session but its own (then logs out) and returns how many it ended.
func (a *adminClient) terminateAll() (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, err := govmomi.NewClient(ctx, &a.url, true)
	if err != nil {
		return 0, fmt.Errorf("admin login: %v", err)
	}
	defer func() { _ = client.Logout(ctx) }()
	ref := *client.ServiceContent.SessionManager
	var sm mo.SessionManager
	err = property.DefaultCollector(client.Client).RetrieveOne(ctx, ref, []string{"sessionList", "currentSession"}, &sm)
	if err != nil {
		return 0, fmt.Errorf("reading sessions: %v", err)
	}
	var ids []string
	for _, s := range sm.SessionList {
		if sm.CurrentSession == nil || s.Key != sm.CurrentSession.Key {
			ids = append(ids, s.Key)
		}
	}
	if len(ids) == 0 {
		return 0, nil
	}
	_, err = methods.TerminateSession(ctx, client.Client, &types.TerminateSession{This: ref, SessionId: ids})
	if err != nil {
		return 0, fmt.Errorf("terminating sessions: %v", err)
	}
	return len(ids), nil
}
