package simulator

// Added to govmomi's simulator package by deploy/vcsim/build.sh (go build -overlay); it is not a package
// of its own and never builds alone.
//
// Changes reported the way vCenter reports them:
//   - MoveIntoFolder_Task: Debian's version removes the object from the registry and puts it back, which a
//     collector reports as an enter then a leave of the same object (a client applying them in order
//     drops it). vCenter moves it: the object stays, its parent and the folders' childEntity change
//     (modify), and only container views whose membership changed report a new view.
//   - ReconfigVM_Task: Debian's configure changes the VM's fields without telling the collectors; the
//     overlay reports every property the reconfiguration changed (a creation's configure is not one).

import (
	"log"
	"path"
	"reflect"

	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

// MoveIntoFolderTask replaces Debian's (renamed moveIntoFolderTaskDebian by build.sh).
func (f *Folder) MoveIntoFolderTask(ctx *Context, c *types.MoveIntoFolder_Task) soap.HasFault {
	task := CreateTask(f, "moveIntoFolder", func(t *Task) (types.AnyType, types.BaseMethodFault) {
		for _, ref := range c.List {
			obj, ok := Map.Get(ref).(mo.Entity)
			if !ok {
				return nil, &types.ManagedObjectNotFound{Obj: ref}
			}
			if obj.Entity().Parent == nil {
				return nil, &types.NotSupported{}
			}
			parent, ok := Map.Get(*obj.Entity().Parent).(*Folder)
			if !ok || !folderHasChildType(&f.Folder, ref.Type) {
				return nil, &types.NotSupported{}
			}
			if ref.Type == "Folder" && folderWithin(&f.Folder, ref) {
				return nil, &types.InvalidFolder{Target: ref}
			}
			folderMoveChild(ctx, &parent.Folder, &f.Folder, obj)
		}
		return nil, nil
	})

	return &methods.MoveIntoFolder_TaskBody{
		Res: &types.MoveIntoFolder_TaskResponse{
			Returnval: task.Run(),
		},
	}
}

// folderWithin reports whether folder f is ancestor or f itself (a folder cannot move into its subtree).
func folderWithin(f *mo.Folder, ancestor types.ManagedObjectReference) bool {
	for ref := &f.Self; ref != nil; {
		if *ref == ancestor {
			return true
		}
		e, ok := Map.Get(*ref).(mo.Entity)
		if !ok {
			return false
		}
		ref = e.Entity().Parent
	}
	return false
}

// folderMoveChild moves o from one folder to another in place and announces each changed property.
func folderMoveChild(ctx *Context, from, to *mo.Folder, o mo.Entity) {
	ref := o.Reference()
	ctx.WithLock(from, func() {
		kept := make([]types.ManagedObjectReference, 0, len(from.ChildEntity))
		for _, child := range from.ChildEntity {
			if child != ref {
				kept = append(kept, child)
			}
		}
		Map.Update(from, []types.PropertyChange{{Name: "childEntity", Val: kept}})
		folderUpdate(from, o, Map.RemoveReference)
	})
	ctx.WithLock(to, func() {
		children := append([]types.ManagedObjectReference{}, to.ChildEntity...)
		if FindReference(children, ref) == nil {
			children = append(children, ref)
		}
		Map.Update(to, []types.PropertyChange{{Name: "childEntity", Val: children}})
		folderUpdate(to, o, Map.AddReference)
	})
	ctx.WithLock(o, func() {
		Map.Update(o, []types.PropertyChange{{Name: "parent", Val: to.Self}})
	})
	refreshContainerViews()
}

// refreshContainerViews recomputes every container view's members and reports those that changed (a
// view over the root with recursive=true keeps a moved object; a view over its old folder loses it).
func refreshContainerViews() {
	Map.m.Lock()
	var views []*ContainerView
	for _, h := range Map.handlers {
		if v, ok := h.(*ContainerView); ok {
			views = append(views, v)
		}
	}
	Map.m.Unlock()
	for _, v := range views {
		fresh := &ContainerView{ContainerView: mo.ContainerView{Recursive: v.Recursive}, root: v.root, types: v.types}
		fresh.add(v.root, make(map[types.ManagedObjectReference]bool))
		Map.WithLock(v, func() {
			if !sameMembers(v.View, fresh.View) {
				Map.Update(v, []types.PropertyChange{{Name: "view", Val: fresh.View}})
			}
		})
	}
}

func sameMembers(a, b []types.ManagedObjectReference) bool {
	if len(a) != len(b) {
		return false
	}
	in := make(map[types.ManagedObjectReference]bool, len(a))
	for _, ref := range a {
		in[ref] = true
	}
	for _, ref := range b {
		if !in[ref] {
			return false
		}
	}
	return true
}

// configure replaces Debian's (renamed configureDebian by build.sh): the same change, then, for a VM
// already in the inventory (a reconfiguration, not a creation), a report of every property it changed.
//
// A VM being created is in the registry before its defaults are configured (NewVirtualMachine puts it in
// its folder first, configures the defaults, sets its runtime, then applies the caller's spec without a
// report). Reporting that first configure sent every watcher a modify with the defaults (memoryMB 32)
// after the enter, and nothing for the spec's values that replace them: a client applying updates in
// order kept the defaults. vCenter reports a new VM once, as an enter with its state; so does this,
// the enter's properties being read when a collector applies it. A VM whose runtime has no connection
// state yet is still being created.
func (vm *VirtualMachine) configure(spec *types.VirtualMachineConfigSpec) types.BaseMethodFault {
	if Map.Get(vm.Self) != mo.Reference(vm) || vm.Runtime.ConnectionState == "" {
		return vm.configureDebian(spec)
	}
	before := cloneValue(getManagedObject(vm))
	err := vm.configureDebian(spec)
	announceChanges(vm, before)
	return err
}

// announceChanges reports to the collectors each property of obj that differs from before (a copy of
// its managed object taken earlier), at the finest path (config.hardware.memoryMB), so a filter on
// that path or on any parent of it (config.hardware, config) matches. The object is already changed.
func announceChanges(obj mo.Reference, before reflect.Value) {
	var changes []types.PropertyChange
	diffValues("", before, getManagedObject(obj), &changes)
	announced := changes[:0]
	for _, change := range changes {
		if wrapped, ok := wrapChange(change.Val); ok {
			change.Val = wrapped
			announced = append(announced, change)
		}
	}
	if len(announced) == 0 {
		return
	}
	val := getManagedObject(obj).Addr().Interface().(mo.Reference)
	Map.applyHandlers(func(o RegisterObject) {
		o.UpdateObject(val, announced)
	})
}

// wrapChange converts a slice to its ArrayOf type as Registry.Update does; false for a slice type
// vim25 has no array of (never seen on a VM; skipped rather than panicking).
func wrapChange(val interface{}) (wrapped interface{}, ok bool) {
	if val == nil {
		return nil, true
	}
	defer func() {
		if r := recover(); r != nil {
			log.Printf("vcsim-gw overlay: cannot report a %T change: %v", val, r)
			ok = false
		}
	}()
	rval := reflect.ValueOf(val)
	return wrapValue(rval, rval.Type()), true
}

// diffValues appends a change for each leaf property that differs between before and after, named by
// its property path (lcFirst field names joined with dots; embedded structs add no element).
func diffValues(prefix string, before, after reflect.Value, out *[]types.PropertyChange) {
	if reflect.DeepEqual(before.Interface(), after.Interface()) {
		return
	}
	switch {
	case after.Kind() == reflect.Struct && isVimStruct(after.Type()):
		for i := 0; i < after.NumField(); i++ {
			f := after.Type().Field(i)
			if f.PkgPath != "" || f.Name == "Self" {
				continue // unexported, or the object's own reference
			}
			name := prefix
			if !f.Anonymous {
				name = joinPath(prefix, lcFirst(f.Name))
			}
			diffValues(name, before.Field(i), after.Field(i), out)
		}
		return
	case after.Kind() == reflect.Ptr && !before.IsNil() && !after.IsNil() && after.Elem().Kind() == reflect.Struct &&
		isVimStruct(after.Elem().Type()):
		diffValues(prefix, before.Elem(), after.Elem(), out)
		return
	}
	if prefix == "" {
		return
	}
	*out = append(*out, types.PropertyChange{Name: prefix, Op: types.PropertyChangeOpAssign, Val: leafValue(after)})
}

func isVimStruct(t reflect.Type) bool {
	base := path.Base(t.PkgPath())
	return base == "types" || base == "mo"
}

func joinPath(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

// leafValue is the value a collector reports for a property: pointers followed, unset ones nil.
func leafValue(v reflect.Value) interface{} {
	switch v.Kind() {
	case reflect.Ptr, reflect.Interface, reflect.Slice, reflect.Map:
		if v.IsNil() {
			return nil
		}
	}
	if v.Kind() == reflect.Ptr {
		v = v.Elem()
	}
	return v.Interface()
}

// cloneValue returns a deep copy of v (structs with unexported fields, such as time.Time, are copied
// as values; the vim25 types have exported fields only).
func cloneValue(v reflect.Value) reflect.Value {
	switch v.Kind() {
	case reflect.Ptr:
		if v.IsNil() {
			return reflect.Zero(v.Type())
		}
		c := reflect.New(v.Type().Elem())
		c.Elem().Set(cloneValue(v.Elem()))
		return c
	case reflect.Interface:
		if v.IsNil() {
			return reflect.Zero(v.Type())
		}
		c := reflect.New(v.Type()).Elem()
		c.Set(cloneValue(v.Elem()))
		return c
	case reflect.Slice:
		if v.IsNil() {
			return reflect.Zero(v.Type())
		}
		c := reflect.MakeSlice(v.Type(), v.Len(), v.Len())
		for i := 0; i < v.Len(); i++ {
			c.Index(i).Set(cloneValue(v.Index(i)))
		}
		return c
	case reflect.Map:
		if v.IsNil() {
			return reflect.Zero(v.Type())
		}
		c := reflect.MakeMapWithSize(v.Type(), v.Len())
		iter := v.MapRange()
		for iter.Next() {
			c.SetMapIndex(iter.Key(), cloneValue(iter.Value()))
		}
		return c
	case reflect.Struct:
		c := reflect.New(v.Type()).Elem()
		c.Set(v)
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).PkgPath == "" {
				c.Field(i).Set(cloneValue(v.Field(i)))
			}
		}
		return c
	}
	return v
}
