package main

// CancelTask for the launcher's slow tasks: the simulator has no CancelTask of its own. A slow task
// (intercept.go) registers a cancel channel while it runs; CancelTask on it closes the channel and the
// task ends with RequestCanceled before its real call is made, as a cancellable vCenter task does. On any
// other task the call reaches the simulator, which answers it with a fault (not cancellable).

import (
	"net/http"
	"sync"

	"github.com/vmware/govmomi/simulator"
)

var cancels = struct {
	sync.Mutex
	byTask map[string]chan struct{}
}{byTask: map[string]chan struct{}{}}

// cancellable registers task as cancellable; the returned channel closes when it is cancelled.
func cancellable(task *simulator.Task) chan struct{} {
	ch := make(chan struct{})
	cancels.Lock()
	cancels.byTask[task.Self.Value] = ch
	cancels.Unlock()
	return ch
}

func settled(task *simulator.Task) {
	cancels.Lock()
	delete(cancels.byTask, task.Self.Value)
	cancels.Unlock()
}

// serveCancel answers CancelTask on a running slow task; false leaves the call to the simulator.
func serveCancel(w http.ResponseWriter, body []byte) bool {
	method, err := simulator.UnmarshalBody(vimType, body)
	if err != nil {
		return false
	}
	cancels.Lock()
	ch, ok := cancels.byTask[method.This.Value]
	if ok {
		delete(cancels.byTask, method.This.Value)
	}
	cancels.Unlock()
	if !ok {
		return false
	}
	close(ch)
	w.Header().Set("Content-Type", "text/xml; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte(soapEnvelopeStart + `<CancelTaskResponse xmlns="urn:vim25"></CancelTaskResponse>` +
		soapEnvelopeEnd))
	return true
}
