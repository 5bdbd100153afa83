package main

// The interceptor sits in front of the simulator's HTTP handler. While a rule is armed (through the
// control endpoint) it decodes each SOAP request and, for a matching method and entity, either answers
// with an injected fault or runs the call as a slow task whose info.progress advances before the real
// call is made. With no rule armed, requests pass straight through.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
	"github.com/vmware/govmomi/vim25/xml"
)

const taskSuffix = "_Task"

// rule selects calls of one SOAP method, optionally on one entity (its name or moid).
type rule struct {
	Method  string  `json:"method"`
	Entity  string  `json:"entity,omitempty"`
	Fault   string  `json:"fault,omitempty"`
	Message string  `json:"message,omitempty"`
	Seconds float64 `json:"seconds,omitempty"`
	// Count is how many more calls the rule applies to; 0 means until it is cleared.
	Count int `json:"count,omitempty"`
}

func (r *rule) matches(method string, labels []string) bool {
	if r.Method != method {
		return false
	}
	if r.Entity == "" {
		return true
	}
	for _, label := range labels {
		if label == r.Entity {
			return true
		}
	}
	return false
}

type interceptor struct {
	next http.Handler

	mu       sync.Mutex
	fails    []*rule
	slows    []*rule
	inflight map[string]int // SOAP method -> requests being served now

	admin *adminClient // for calls that outlive their caller's session

	running sync.WaitGroup
	stop    chan struct{}
	once    sync.Once
}

func newInterceptor(next http.Handler, admin *adminClient) *interceptor {
	return &interceptor{next: next, admin: admin, stop: make(chan struct{}), inflight: map[string]int{}}
}

func (g *interceptor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || !strings.HasPrefix(r.URL.Path, "/sdk") {
		g.next.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(r.Body)
	_ = r.Body.Close()
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	name := methodName(body)
	g.track(name, 1)
	defer g.track(name, -1)
	if name == "CancelTask" && g.sessionValid(r) && serveCancel(w, body) {
		return
	}
	if g.armed() {
		if method := g.decode(body); method != nil && g.intercept(w, r, body, method) {
			return
		}
	}
	if name == "CreateCollectorForTasks" && g.sessionValid(r) {
		if method, err := simulator.UnmarshalBody(vimType, body); err == nil {
			createTaskCollector(w, method)
			return
		}
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	g.next.ServeHTTP(w, r)
	if announce, ok := unannounced[name]; ok {
		if method, err := simulator.UnmarshalBody(vimType, body); err == nil {
			announce(method.This)
		}
	}
}

// unannounced lists methods whose change the simulator makes without telling its PropertyCollector,
// so WaitForUpdatesEx would never report it (a real vCenter does); after the call the interceptor
// announces the changed property with its current value.
var unannounced = map[string]func(types.ManagedObjectReference){
	"EnterMaintenanceMode_Task": announceMaintenance,
	"ExitMaintenanceMode_Task":  announceMaintenance,
}

func announceMaintenance(ref types.ManagedObjectReference) {
	host, ok := simulator.Map.Get(ref).(*simulator.HostSystem)
	if !ok {
		return
	}
	var value bool
	simulator.Map.WithLock(host, func() { value = host.Runtime.InMaintenanceMode })
	updateLocked(host, []types.PropertyChange{{Name: "runtime.inMaintenanceMode", Val: value}})
}

var bodyElement = regexp.MustCompile(`Body[^>]*>\s*<([A-Za-z0-9_:.-]+)`)

// methodName finds the SOAP method cheaply (the first element inside the Body), "" if none.
func methodName(body []byte) string {
	match := bodyElement.FindSubmatch(body)
	if match == nil {
		return ""
	}
	name := string(match[1])
	if i := strings.LastIndexByte(name, ':'); i >= 0 {
		name = name[i+1:]
	}
	return name
}

func (g *interceptor) track(method string, delta int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inflight[method] += delta
	if g.inflight[method] <= 0 {
		delete(g.inflight, method)
	}
}

// calls returns how many requests of each SOAP method are being served right now.
func (g *interceptor) calls() map[string]int {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string]int, len(g.inflight))
	for k, v := range g.inflight {
		out[k] = v
	}
	return out
}

func (g *interceptor) armed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.fails)+len(g.slows) > 0
}

// decode returns the SOAP method when the body may match an armed rule, nil otherwise.
func (g *interceptor) decode(body []byte) *simulator.Method {
	g.mu.Lock()
	mentioned := false
	for _, r := range append(append([]*rule{}, g.fails...), g.slows...) {
		mentioned = mentioned || bytes.Contains(body, []byte(r.Method))
	}
	g.mu.Unlock()
	if !mentioned {
		return nil
	}
	method, err := simulator.UnmarshalBody(vimType, body)
	if err != nil {
		return nil
	}
	return method
}

// vimType resolves vim25 type names, tolerating a namespace prefix ("ns1:TraversalSpec").
func vimType(name string) (reflect.Type, bool) {
	if t, ok := types.TypeFunc()(name); ok {
		return t, true
	}
	if parts := strings.SplitN(name, ":", 2); len(parts) == 2 {
		return types.TypeFunc()(parts[1])
	}
	return nil, false
}

// unauthenticated lists the methods the simulator serves without a session.
var unauthenticated = map[string]bool{
	"RetrieveServiceContent": true, "Login": true, "LoginByToken": true, "LoginExtensionByCertificate": true,
	"RetrieveProperties": true, "RetrievePropertiesEx": true, "CloneSession": true,
}

func (g *interceptor) intercept(w http.ResponseWriter, r *http.Request, body []byte, m *simulator.Method) bool {
	labels := entityLabels(m.This)
	isTask := strings.HasSuffix(m.Name, taskSuffix)
	fail := g.find(&g.fails, m.Name, labels)
	slow := g.find(&g.slows, m.Name, labels)
	if fail == nil && (slow == nil || !isTask) {
		return false
	}
	// An injected answer must not let a caller without a session past the simulator's own check.
	if !unauthenticated[m.Name] && !g.sessionValid(r) {
		return false
	}
	if fail != nil && g.consume(&g.fails, fail) {
		g.answerFault(w, m, fail)
		return true
	}
	if slow != nil && isTask && g.consume(&g.slows, slow) {
		g.startSlow(w, r, body, m, slow.Seconds)
		return true
	}
	return false
}

func (g *interceptor) find(rules *[]*rule, method string, labels []string) *rule {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, r := range *rules {
		if r.matches(method, labels) {
			return r
		}
	}
	return nil
}

// consume uses one application of r; false when another request used up its last one meanwhile.
func (g *interceptor) consume(rules *[]*rule, r *rule) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, candidate := range *rules {
		if candidate != r {
			continue
		}
		if r.Count > 0 {
			r.Count--
			if r.Count == 0 {
				*rules = append((*rules)[:i:i], (*rules)[i+1:]...)
			}
		}
		return true
	}
	return false
}

func (g *interceptor) addFail(r rule) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.fails = append(g.fails, &r)
}

// setSlow arms r, replacing any rule for the same method and entity; Seconds <= 0 only clears.
func (g *interceptor) setSlow(r rule) {
	g.mu.Lock()
	defer g.mu.Unlock()
	kept := g.slows[:0:0]
	for _, old := range g.slows {
		if old.Method != r.Method || old.Entity != r.Entity {
			kept = append(kept, old)
		}
	}
	if r.Seconds > 0 {
		kept = append(kept, &r)
	}
	g.slows = kept
}

func (g *interceptor) reset() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.fails, g.slows = nil, nil
}

// rules returns copies of the armed rules.
func (g *interceptor) rules() map[string][]rule {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := map[string][]rule{"fail": {}, "slow": {}}
	for _, r := range g.fails {
		out["fail"] = append(out["fail"], *r)
	}
	for _, r := range g.slows {
		out["slow"] = append(out["slow"], *r)
	}
	return out
}

// shutdown ends running slow tasks (they fail with RequestCanceled) and waits briefly for them.
func (g *interceptor) shutdown() {
	g.once.Do(func() { close(g.stop) })
	done := make(chan struct{})
	go func() {
		g.running.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
	}
}

// entityLabels returns the moid and, for a managed entity, its name.
func entityLabels(ref types.ManagedObjectReference) []string {
	labels := []string{ref.Value}
	if e, ok := simulator.Map.Get(ref).(mo.Entity); ok {
		labels = append(labels, e.Entity().Name)
	}
	return labels
}

const currentTimeRequest = `<?xml version="1.0" encoding="UTF-8"?>` +
	`<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/"><soapenv:Body>` +
	`<CurrentTime xmlns="urn:vim25"><_this type="ServiceInstance">ServiceInstance</_this></CurrentTime>` +
	`</soapenv:Body></soapenv:Envelope>`

// sessionValid asks the simulator itself whether the request's session cookie is logged in.
func (g *interceptor) sessionValid(r *http.Request) bool {
	probe := r.Clone(context.Background())
	probe.Body = io.NopCloser(strings.NewReader(currentTimeRequest))
	probe.ContentLength = int64(len(currentTimeRequest))
	rec := httptest.NewRecorder()
	g.next.ServeHTTP(rec, probe)
	return rec.Code == http.StatusOK
}

func (g *interceptor) answerFault(w http.ResponseWriter, m *simulator.Method, r *rule) {
	fault, _ := newFault(r.Fault)
	fillReferences(reflect.ValueOf(fault).Elem(), m.This)
	message := r.Message
	if message == "" {
		message = "injected fault " + reflect.TypeOf(fault).Elem().Name() + " for " + m.Name
	}
	if !strings.HasSuffix(m.Name, taskSuffix) {
		writeFault(w, message, fault)
		return
	}
	task := newRunningTask(m)
	finishTask(task, nil, fault, message)
	writeTaskResponse(w, m.Name, task.Self)
}

func (g *interceptor) startSlow(w http.ResponseWriter, r *http.Request, body []byte, m *simulator.Method, seconds float64) {
	task := newRunningTask(m)
	replay := r.Clone(context.Background())
	g.running.Add(1)
	go g.runSlow(task, replay, body, seconds)
	writeTaskResponse(w, m.Name, task.Self)
}

// runSlow advances progress 10..90 in ten equal steps, then makes the real call and completes the task
// with its outcome (progress 100).
func (g *interceptor) runSlow(task *simulator.Task, replay *http.Request, body []byte, seconds float64) {
	defer g.running.Done()
	cancelled := cancellable(task)
	defer settled(task)
	step := time.Duration(seconds * float64(time.Second) / 10)
	for progress := 10; progress <= 100; progress += 10 {
		select {
		case <-g.stop:
			finishTask(task, nil, &types.RequestCanceled{}, "the simulator is shutting down")
			return
		case <-cancelled:
			finishTask(task, nil, &types.RequestCanceled{}, "The task was canceled by a user.")
			return
		case <-time.After(step):
		}
		if progress < 100 {
			updateLocked(task, []types.PropertyChange{{Name: "info.progress", Val: int32(progress)}})
		}
	}
	result, fault, message := g.execute(replay, body)
	finishTask(task, result, fault, message)
}

var taskReturnval = regexp.MustCompile(`<returnval[^>]*>(task-[^<]+)</returnval>`)

// execute replays the original request against the simulator and reports the outcome of its task.
// A task outlives its caller: when the caller's session has ended meanwhile, the replay runs in a
// session of the launcher's own.
func (g *interceptor) execute(replay *http.Request, body []byte) (types.AnyType, types.BaseMethodFault, string) {
	code, out := g.replay(replay, body)
	if code != http.StatusOK {
		if fault, _ := decodeFault(out); isNotAuthenticated(fault) && g.admin != nil {
			code, out = g.replayAsAdmin(replay, body)
		}
	}
	if code != http.StatusOK {
		fault, message := decodeFault(out)
		return nil, fault, message
	}
	match := taskReturnval.FindSubmatch(out)
	if match == nil {
		return nil, &types.SystemError{Reason: "no task in the reply"}, "the simulator returned no task"
	}
	inner, ok := simulator.Map.Get(types.ManagedObjectReference{Type: "Task", Value: string(match[1])}).(*simulator.Task)
	if !ok {
		return nil, &types.SystemError{Reason: "task vanished"}, "the simulator's task vanished"
	}
	info := waitTask(inner)
	if info.Error != nil {
		return nil, info.Error.Fault, info.Error.LocalizedMessage
	}
	return info.Result, nil, ""
}

func (g *interceptor) replay(r *http.Request, body []byte) (int, []byte) {
	r.Body = io.NopCloser(bytes.NewReader(body))
	rec := httptest.NewRecorder()
	g.next.ServeHTTP(rec, r)
	return rec.Code, rec.Body.Bytes()
}

func (g *interceptor) replayAsAdmin(r *http.Request, body []byte) (int, []byte) {
	var code int
	var out []byte
	err := g.admin.withSession(func(key string) {
		r.Header.Del("Cookie")
		r.AddCookie(&http.Cookie{Name: soap.SessionCookieName, Value: key})
		code, out = g.replay(r, body)
	})
	if err != nil {
		log.Printf("slow task: %v", err)
		return http.StatusInternalServerError, nil
	}
	return code, out
}

func isNotAuthenticated(fault types.BaseMethodFault) bool {
	_, ok := fault.(*types.NotAuthenticated)
	return ok
}

func waitTask(task *simulator.Task) types.TaskInfo {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var info types.TaskInfo
		simulator.Map.WithLock(task, func() { info = task.Info })
		done := info.State == types.TaskInfoStateSuccess || info.State == types.TaskInfoStateError
		if done || time.Now().After(deadline) {
			return info
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func newRunningTask(m *simulator.Method) *simulator.Task {
	task := simulator.CreateTask(m.This, strings.TrimSuffix(m.Name, taskSuffix)+"Task", nil)
	changes := []types.PropertyChange{
		{Name: "info.startTime", Val: time.Now()},
		{Name: "info.state", Val: types.TaskInfoStateRunning},
		{Name: "info.progress", Val: int32(0)},
	}
	if labels := entityLabels(m.This); len(labels) > 1 {
		changes = append(changes, types.PropertyChange{Name: "info.entityName", Val: labels[1]})
	}
	updateLocked(task, changes)
	return task
}

// finishTask records the outcome the way simulator.Task.Run does.
func finishTask(task *simulator.Task, result types.AnyType, fault types.BaseMethodFault, message string) {
	state := types.TaskInfoStateSuccess
	var failure interface{}
	changes := []types.PropertyChange{{Name: "info.completeTime", Val: time.Now()}}
	if fault != nil {
		state = types.TaskInfoStateError
		failure = types.LocalizedMethodFault{Fault: fault, LocalizedMessage: message}
	} else {
		changes = append(changes, types.PropertyChange{Name: "info.progress", Val: int32(100)})
	}
	changes = append(changes,
		types.PropertyChange{Name: "info.state", Val: state},
		types.PropertyChange{Name: "info.result", Val: result},
		types.PropertyChange{Name: "info.error", Val: failure},
	)
	updateLocked(task, changes)
}

// updateLocked applies changes while holding the object's lock, which the PropertyCollector also takes.
func updateLocked(obj mo.Reference, changes []types.PropertyChange) {
	simulator.Map.WithLock(obj, func() { simulator.Map.Update(obj, changes) })
}

// newFault builds an empty vim fault by type name ("InvalidState", "vim.fault.InvalidState").
func newFault(name string) (types.BaseMethodFault, error) {
	for _, prefix := range []string{"vim.fault.", "vmodl.fault.", "vim."} {
		name = strings.TrimPrefix(name, prefix)
	}
	if name == "" {
		name = "InvalidState"
	}
	t, ok := types.TypeFunc()(name)
	if !ok {
		return nil, fmt.Errorf("unknown fault type %q", name)
	}
	fault, ok := reflect.New(t).Interface().(types.BaseMethodFault)
	if !ok {
		return nil, fmt.Errorf("%q is not a fault type", name)
	}
	return fault, nil
}

var morefType = reflect.TypeOf(types.ManagedObjectReference{})

// fillReferences points every unset object reference in a fault (NoPermission.object, ...) at the called
// object: an empty reference is not valid on the wire and clients fail to decode it.
func fillReferences(v reflect.Value, this types.ManagedObjectReference) {
	if v.Kind() != reflect.Struct {
		return
	}
	if v.Type() == morefType {
		if v.FieldByName("Type").String() == "" {
			v.Set(reflect.ValueOf(this))
		}
		return
	}
	for i := 0; i < v.NumField(); i++ {
		if field := v.Field(i); field.CanSet() {
			fillReferences(field, this)
		}
	}
}

const soapEnvelopeStart = `<?xml version="1.0" encoding="UTF-8"?>` +
	`<soapenv:Envelope xmlns:soapenc="http://schemas.xmlsoap.org/soap/encoding/" ` +
	`xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/" xmlns:xsd="http://www.w3.org/2001/XMLSchema" ` +
	`xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"><soapenv:Body>`

const soapEnvelopeEnd = `</soapenv:Body></soapenv:Envelope>`

func writeTaskResponse(w http.ResponseWriter, method string, ref types.ManagedObjectReference) {
	w.Header().Set("Content-Type", "text/xml; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	fmt.Fprintf(w, `%s<%sResponse xmlns="urn:vim25"><returnval type="Task">%s</returnval></%sResponse>%s`,
		soapEnvelopeStart, method, ref.Value, method, soapEnvelopeEnd)
}

// faultDetail encodes a fault as <KindFault xsi:type="Kind">, as vSphere does.
type faultDetail struct {
	Fault types.BaseMethodFault
}

func (d *faultDetail) MarshalXML(e *xml.Encoder, start xml.StartElement) error {
	kind := reflect.TypeOf(d.Fault).Elem().Name()
	start.Name.Local = kind + "Fault"
	start.Attr = append(start.Attr,
		xml.Attr{Name: xml.Name{Local: "xmlns"}, Value: "urn:vim25"},
		xml.Attr{Name: xml.Name{Local: "xsi:type"}, Value: kind})
	return e.EncodeElement(d.Fault, start)
}

type faultBody struct {
	XMLName xml.Name `xml:"soapenv:Fault"`
	Code    string   `xml:"faultcode"`
	String  string   `xml:"faultstring"`
	Detail  struct {
		Fault *faultDetail
	} `xml:"detail"`
}

func writeFault(w http.ResponseWriter, message string, fault types.BaseMethodFault) {
	body := faultBody{Code: "ServerFaultCode", String: message}
	body.Detail.Fault = &faultDetail{fault}
	var out bytes.Buffer
	out.WriteString(soapEnvelopeStart)
	if err := xml.NewEncoder(&out).Encode(&body); err != nil {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	out.WriteString(soapEnvelopeEnd)
	w.Header().Set("Content-Type", "text/xml; charset=utf-8")
	w.WriteHeader(http.StatusInternalServerError)
	_, _ = w.Write(out.Bytes())
}

// decodeFault reads the fault out of a SOAP fault reply.
func decodeFault(reply []byte) (types.BaseMethodFault, string) {
	var envelope struct {
		Body struct {
			Fault *soap.Fault `xml:"http://schemas.xmlsoap.org/soap/envelope/ Fault"`
		} `xml:"http://schemas.xmlsoap.org/soap/envelope/ Body"`
	}
	dec := xml.NewDecoder(bytes.NewReader(reply))
	dec.TypeFunc = types.TypeFunc()
	if err := dec.Decode(&envelope); err == nil && envelope.Body.Fault != nil {
		f := envelope.Body.Fault
		if fault := asFault(f.Detail.Fault); fault != nil {
			return fault, f.String
		}
		return &types.SystemError{Reason: f.String}, f.String
	}
	return &types.SystemError{Reason: "unreadable reply"}, "the simulator's reply could not be read"
}

// asFault returns the decoded detail as a fault; the decoder yields struct values, faults are pointers.
func asFault(detail types.AnyType) types.BaseMethodFault {
	if fault, ok := detail.(types.BaseMethodFault); ok {
		return fault
	}
	if detail == nil || reflect.TypeOf(detail).Kind() != reflect.Struct {
		return nil
	}
	ptr := reflect.New(reflect.TypeOf(detail))
	ptr.Elem().Set(reflect.ValueOf(detail))
	fault, _ := ptr.Interface().(types.BaseMethodFault)
	return fault
}
