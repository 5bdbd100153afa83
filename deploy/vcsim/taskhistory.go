package main

// Task history: govmomi 0.24.2's simulator has no TaskHistoryCollector, so `get_tasks` could never be
// tested on real tasks. The launcher records every task the simulator creates (a registry handler sees
// each Task object as it is put) and answers TaskManager.CreateCollectorForTasks itself (the
// interceptor), returning a collector registered in the simulator's registry, whose methods
// (SetCollectorPageSize, ResetCollector, RewindCollector, ReadNextTasks, ReadPreviousTasks,
// DestroyCollector) and `latestPage` property are then served by the simulator like any other object.
//
// Filters honoured: time (queuedTime, startedTime, completedTime), state, userName and entity (the
// entity itself; recursion "children"/"all" also match the entity itself only). Records keep the task's
// live TaskInfo, so a running task shows its current state. entityName is the entity's name at queue
// time (the simulator itself puts the moid there; vCenter puts the name).

import (
	"fmt"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

const maxTaskHistory = 20000

// taskRecorder keeps every task the simulator creates, oldest first (bounded).
type taskRecorder struct {
	self  types.ManagedObjectReference
	mu    sync.Mutex
	tasks []*simulator.Task
}

var recorder = &taskRecorder{self: types.ManagedObjectReference{Type: "TaskRecorder", Value: "task-recorder"}}

var collectorCount int64

func (t *taskRecorder) Reference() types.ManagedObjectReference { return t.self }

func (t *taskRecorder) PutObject(obj mo.Reference) {
	task, ok := obj.(*simulator.Task)
	if !ok {
		return
	}
	if task.Info.Entity != nil {
		if entity, ok := simulator.Map.Get(*task.Info.Entity).(mo.Entity); ok {
			task.Info.EntityName = entity.Entity().Name
		}
	}
	t.mu.Lock()
	t.tasks = append(t.tasks, task)
	if len(t.tasks) > maxTaskHistory {
		t.tasks = t.tasks[len(t.tasks)-maxTaskHistory:]
	}
	t.mu.Unlock()
}

func (t *taskRecorder) UpdateObject(mo.Reference, []types.PropertyChange) {}

func (t *taskRecorder) RemoveObject(types.ManagedObjectReference) {}

// matching returns the TaskInfo of recorded tasks the filter selects, oldest queued first.
func (t *taskRecorder) matching(filter *types.TaskFilterSpec) []types.TaskInfo {
	t.mu.Lock()
	tasks := append([]*simulator.Task(nil), t.tasks...)
	t.mu.Unlock()
	var out []types.TaskInfo
	for _, task := range tasks {
		var info types.TaskInfo
		simulator.Map.WithLock(task, func() { info = task.Info })
		if taskMatches(&info, filter) {
			out = append(out, info)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].QueueTime.Before(out[j].QueueTime) })
	return out
}

func taskMatches(info *types.TaskInfo, f *types.TaskFilterSpec) bool {
	if f == nil {
		return true
	}
	if f.Time != nil {
		var when *time.Time
		switch f.Time.TimeType {
		case types.TaskFilterSpecTimeOptionQueuedTime:
			when = &info.QueueTime
		case types.TaskFilterSpecTimeOptionStartedTime:
			when = info.StartTime
		case types.TaskFilterSpecTimeOptionCompletedTime:
			when = info.CompleteTime
		}
		if when == nil {
			return false
		}
		if f.Time.BeginTime != nil && when.Before(*f.Time.BeginTime) {
			return false
		}
		if f.Time.EndTime != nil && when.After(*f.Time.EndTime) {
			return false
		}
	}
	if len(f.State) > 0 {
		found := false
		for _, state := range f.State {
			found = found || state == info.State
		}
		if !found {
			return false
		}
	}
	if f.UserName != nil && (len(f.UserName.UserList) > 0 || f.UserName.SystemUser) {
		user := ""
		if reason, ok := info.Reason.(*types.TaskReasonUser); ok {
			user = reason.UserName
		}
		found := false
		for _, name := range f.UserName.UserList {
			found = found || name == user
		}
		if !found {
			return false
		}
	}
	if f.Entity != nil && (info.Entity == nil || *info.Entity != f.Entity.Entity) {
		return false
	}
	return true
}

// taskHistoryCollector is a TaskHistoryCollector over the recorder. Like vCenter's, it reads the tasks
// matching its filter when created or reset; the scroll position then sits just before the latest page.
type taskHistoryCollector struct {
	mo.TaskHistoryCollector

	filter   types.TaskFilterSpec
	pageSize int
	items    []types.TaskInfo
	pos      int // items[:pos] are older than the scroll position, items[pos:] newer
}

func newTaskHistoryCollector(filter types.TaskFilterSpec) *taskHistoryCollector {
	c := &taskHistoryCollector{filter: filter, pageSize: 10}
	c.Self = types.ManagedObjectReference{
		Type: "TaskHistoryCollector", Value: fmt.Sprintf("taskcollector-%d", atomic.AddInt64(&collectorCount, 1)),
	}
	c.Filter = filter
	c.reset()
	return c
}

func (c *taskHistoryCollector) reset() {
	c.items = recorder.matching(&c.filter)
	latest := c.pageSize
	if latest > len(c.items) {
		latest = len(c.items)
	}
	c.LatestPage = append([]types.TaskInfo(nil), c.items[len(c.items)-latest:]...)
	c.pos = len(c.items) - latest
}

func (c *taskHistoryCollector) SetCollectorPageSize(req *types.SetCollectorPageSize) soap.HasFault {
	body := &methods.SetCollectorPageSizeBody{}
	if req.MaxCount < 0 || req.MaxCount > 1000 {
		body.Fault_ = simulator.Fault("", &types.InvalidArgument{InvalidProperty: "maxCount"})
		return body
	}
	c.pageSize = int(req.MaxCount)
	c.reset()
	body.Res = new(types.SetCollectorPageSizeResponse)
	return body
}

func (c *taskHistoryCollector) ResetCollector(req *types.ResetCollector) soap.HasFault {
	c.reset()
	return &methods.ResetCollectorBody{Res: new(types.ResetCollectorResponse)}
}

func (c *taskHistoryCollector) RewindCollector(req *types.RewindCollector) soap.HasFault {
	c.items = recorder.matching(&c.filter)
	c.pos = 0
	return &methods.RewindCollectorBody{Res: new(types.RewindCollectorResponse)}
}

func (c *taskHistoryCollector) ReadNextTasks(req *types.ReadNextTasks) soap.HasFault {
	body := &methods.ReadNextTasksBody{}
	if req.MaxCount <= 0 {
		body.Fault_ = simulator.Fault("", &types.InvalidArgument{InvalidProperty: "maxCount"})
		return body
	}
	end := c.pos + int(req.MaxCount)
	if end > len(c.items) {
		end = len(c.items)
	}
	body.Res = &types.ReadNextTasksResponse{Returnval: append([]types.TaskInfo(nil), c.items[c.pos:end]...)}
	c.pos = end
	return body
}

func (c *taskHistoryCollector) ReadPreviousTasks(req *types.ReadPreviousTasks) soap.HasFault {
	body := &methods.ReadPreviousTasksBody{}
	if req.MaxCount <= 0 {
		body.Fault_ = simulator.Fault("", &types.InvalidArgument{InvalidProperty: "maxCount"})
		return body
	}
	start := c.pos - int(req.MaxCount)
	if start < 0 {
		start = 0
	}
	body.Res = &types.ReadPreviousTasksResponse{Returnval: append([]types.TaskInfo(nil), c.items[start:c.pos]...)}
	c.pos = start
	return body
}

func (c *taskHistoryCollector) DestroyCollector(req *types.DestroyCollector) soap.HasFault {
	simulator.Map.Remove(c.Self)
	return &methods.DestroyCollectorBody{Res: new(types.DestroyCollectorResponse)}
}

// createTaskCollector answers TaskManager.CreateCollectorForTasks (called by the interceptor).
func createTaskCollector(w http.ResponseWriter, m *simulator.Method) {
	req, ok := m.Body.(*types.CreateCollectorForTasks)
	if !ok {
		writeFault(w, "CreateCollectorForTasks: unexpected request", &types.InvalidArgument{InvalidProperty: "filter"})
		return
	}
	collector := newTaskHistoryCollector(req.Filter)
	simulator.Map.Put(collector)
	w.Header().Set("Content-Type", "text/xml; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	fmt.Fprintf(w, `%s<CreateCollectorForTasksResponse xmlns="urn:vim25">`+
		`<returnval type="TaskHistoryCollector">%s</returnval></CreateCollectorForTasksResponse>%s`,
		soapEnvelopeStart, collector.Self.Value, soapEnvelopeEnd)
}
