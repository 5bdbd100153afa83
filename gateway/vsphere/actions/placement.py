"""Where a VM lives: migrate it to another host, datastore or pool, or clone it (both need a vCenter)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyVmomi

from gateway import errors
from gateway.vocabulary import AffectedObject, Plan
from gateway.vsphere.actions.execution import Execution, _executor
from gateway.vsphere.actions.planning import (
    MAX_NAME_CHARS,
    Args,
    _argument,
    _check_name,
    _datastore_on_host,
    _host_facts,
    _label,
    _moid,
    _moids,
    _on,
    _read,
    _resolve_vm,
    _state_after_policy,
    _target,
    _vm_params,
    vm_affected,
    vsphere_name,
)
from gateway.vsphere.collector import managed_object, object_spec, retrieve, traverse
from gateway.vsphere.resolve import (
    HostRef,
    VmRef,
    find_vm_by_name,
    resolve_folder,
    resolve_host,
    resolve_pool,
    vm_facts,
)

vim: Any = pyVmomi.vim  # pyVmomi's constructors are untyped


def require_vcenter(session: Any, what: str) -> None:
    """Refuse, in plan, an operation a standalone ESXi host does not offer (migration, cloning)."""
    if getattr(session.content.about, "apiType", None) != "VirtualCenter":
        raise errors.NotSupported(
            f"target '{_target(session)}' is a standalone ESXi host; {what} needs a vCenter. Run it on the "
            "target for the vCenter that manages this host", target=_target(session))


def _compute_root_pool(session: Any, compute_moid: str | None) -> str | None:
    if compute_moid is None:
        return None
    return _moid(_read(session, vim.ComputeResource, compute_moid, ("resourcePool",)).get("resourcePool"))


def _usable_host(session: Any, field: str, ref: str) -> HostRef:
    host = _argument(field, resolve_host, session, ref)
    if host.connection_state != "connected":
        raise errors.InvalidArgument(field, f"host '{host.name}' is {host.connection_state}, not connected")
    if host.in_maintenance:
        raise errors.InvalidArgument(field, f"host '{host.name}' is in maintenance mode")
    return host


@dataclass
class _Move:
    """Where a migration goes, filled in argument by argument."""

    params: dict[str, Any]
    words: list[str]


def _move_host(session: Any, vm: VmRef, ref: str, move: _Move) -> HostRef:
    host = _usable_host(session, "host", ref)
    if host.moid == vm.host_moid:
        raise errors.InvalidArgument("host", f"{_label(vm)} already runs on host '{host.name}'")
    move.params.update(host=host.moid, host_name=host.name)
    move.words.append(f"to host '{host.name}'")
    return host


def _move_pool(session: Any, vm: VmRef, ref: str | None, host: HostRef | None, move: _Move) -> None:
    current = resolve_host(session, vm.host_moid).compute_resource_moid if vm.host_moid else None
    if ref is None:
        if host is not None and host.compute_resource_moid != current:
            root = _compute_root_pool(session, host.compute_resource_moid)
            move.params.update(pool=root, pool_name=f"{host.cluster or host.name}/Resources")
            move.words.append(f"into the root resource pool of '{host.cluster or host.name}'")
        return
    pool = _argument("resource_pool", resolve_pool, session, ref)
    owner = host.compute_resource_moid if host is not None else current
    if pool.owner_moid != owner:
        where = f"host '{host.name}'" if host is not None else "the VM's current host"
        raise errors.InvalidArgument(
            "resource_pool", f"pool '{pool.name}' belongs to '{pool.owner}', not to the cluster or host of "
            f"{where}; name a host of that cluster too")
    if pool.moid == vm.resource_pool_moid:
        raise errors.InvalidArgument("resource_pool", f"{_label(vm)} is already in pool '{pool.name}'")
    move.params.update(pool=pool.moid, pool_name=pool.name)
    move.words.append(f"into resource pool '{pool.name}'")


def _move_datastore(session: Any, vm: VmRef, ref: str, host: HostRef | None, move: _Move) -> None:
    facts = _host_facts(session, host.moid if host is not None else vm.host_moid)
    ds = _datastore_on_host(session, "datastore", ref, facts)
    current = _moids(_read(session, vim.VirtualMachine, vm.moid, ("datastore",)).get("datastore"))
    if current == [ds.moid]:
        raise errors.InvalidArgument("datastore", f"{_label(vm)} is already stored on datastore '{ds.name}'")
    move.params.update(datastore=ds.moid, datastore_name=ds.name)
    move.words.append(f"to datastore '{ds.name}'")


@_state_after_policy
def plan_migrate(session: Any, args: Args) -> Plan:
    """Plan a relocation to another host, datastore and/or resource pool of the same target.

    A host in another cluster without a pool moves the VM into that cluster's root pool.
    """
    if all(args.get(k) is None for k in ("host", "datastore", "resource_pool")):
        raise errors.InvalidArgument("arguments", "give at least one of host, datastore, resource_pool")
    require_vcenter(session, "migration")
    vm = _resolve_vm(session, args, "migration")
    move = _Move({}, [])
    host = _move_host(session, vm, str(args["host"]), move) if args.get("host") is not None else None
    _move_pool(session, vm, args.get("resource_pool"), host, move)
    if args.get("datastore") is not None:
        _move_datastore(session, vm, str(args["datastore"]), host, move)
    params = {**move.params, **_vm_params(vm, args)}
    return Plan(_on(session, f"Migrate {_label(vm)} {', '.join(move.words)}"), (vm_affected(vm),), params)


@_executor
def execute_migrate(call: Execution) -> dict[str, Any]:
    """RelocateVM_Task with the planned host/datastore/pool; report where the VM is afterwards."""
    p = call.params
    spec = vim.vm.RelocateSpec()
    for key, vim_type in (("host", vim.HostSystem), ("datastore", vim.Datastore), ("pool", vim.ResourcePool)):
        if p.get(key):
            setattr(spec, key, call.obj(vim_type, p[key]))
    call.task(call.vm().RelocateVM_Task, destructive=False, label=f"migrate {p['vm_name']}", spec=spec,
              priority="defaultPriority")
    now = vm_facts(call.session, p["vm"])
    return call.result(vm=p["vm_name"], moid=p["vm"], host=now.host, resource_pool=now.resource_pool,
                       datastores=_datastore_names(call.session, p["vm"]))


def _datastore_names(session: Any, vm_moid: str) -> list[str]:
    vm = managed_object(session, vim.VirtualMachine, vm_moid)
    to_datastores = traverse("vmDatastores", vim.VirtualMachine, "datastore")
    spec = object_spec(vm, {vim.Datastore: ("name",)}, (to_datastores,))
    objects = retrieve(session, spec)
    return sorted(str(o.props.get("name", o.moid)) for o in objects if o.type == "Datastore")


def _unused_vm_name(session: Any, name: str) -> None:
    taken = find_vm_by_name(session, name)
    if taken:
        raise errors.InvalidArgument(
            "name", f"a VM named '{name}' already exists on target '{_target(session)}' "
            f"({', '.join(taken)}); choose an unused name")


@_state_after_policy
def plan_clone(session: Any, args: Args) -> Plan:
    """Plan a clone into the source's folder and pool (or the given ones) under a name no VM has."""
    require_vcenter(session, "cloning")
    vm = _resolve_vm(session, args, "cloning")
    name = vsphere_name(_check_name("name", str(args["name"])))
    if len(name) > MAX_NAME_CHARS:
        raise errors.InvalidArgument("name", f"must be at most {MAX_NAME_CHARS} characters once '/', '\\' "
                                     "and '%' are escaped as vSphere stores them (%2f, %5c, %25)")
    _unused_vm_name(session, name)
    params: dict[str, Any] = {**_vm_params(vm, args), "name": name,
                              "power_on": bool(args.get("power_on", False))}
    folder_path = vm.folder
    params["folder"] = vm.folder_moid
    if args.get("folder") is not None:
        folder = _argument("folder", resolve_folder, session, str(args["folder"]))
        if "VirtualMachine" not in folder.child_types:
            raise errors.InvalidArgument("folder", f"folder '{folder.path or folder.name}' cannot hold VMs")
        params["folder"], folder_path = folder.moid, folder.path
    pool_name = vm.resource_pool
    params["pool"] = vm.resource_pool_moid
    if args.get("resource_pool") is not None:
        pool = _argument("resource_pool", resolve_pool, session, str(args["resource_pool"]))
        params["pool"], pool_name = pool.moid, pool.name
    if params["pool"] is None:
        raise errors.InvalidArgument("resource_pool", f"{_label(vm)} is a template; name the target pool")
    words = [f"into folder '{folder_path}'" if folder_path else "",
             f"in pool '{pool_name}'" if pool_name else ""]
    if args.get("datastore") is not None:
        host = _host_facts(session, vm.host_moid)
        ds = _datastore_on_host(session, "datastore", str(args["datastore"]), host)
        params["datastore"], params["datastore_name"] = ds.moid, ds.name
        words.append(f"on datastore '{ds.name}'")
    if params["power_on"]:
        words.append("then power it on")
    clone = AffectedObject("vm", name, "", folder_path, pool_name)
    summary = f"Clone {_label(vm)} as new VM '{name}' " + " ".join(w for w in words if w)
    return Plan(_on(session, summary.rstrip()), (vm_affected(vm), clone), params)


@_executor
def execute_clone(call: Execution) -> dict[str, Any]:
    """CloneVM_Task (the name is checked again first), then power the clone on if asked."""
    p = call.params
    _unused_vm_name(call.session, p["name"])
    location = vim.vm.RelocateSpec(pool=call.obj(vim.ResourcePool, p["pool"]))
    if p.get("datastore"):
        location.datastore = call.obj(vim.Datastore, p["datastore"])
    spec = vim.vm.CloneSpec(location=location, powerOn=False, template=False)
    ref = call.task(call.vm().CloneVM_Task, destructive=False, label=f"clone {p['vm_name']} as {p['name']}",
                    folder=call.obj(vim.Folder, p["folder"]), name=p["name"], spec=spec)
    clone = vm_facts(call.session, str(_moid(ref)))
    powered = False
    if p["power_on"] and clone.power_state != "poweredOn":
        call.task(call.vm(clone.moid).PowerOnVM_Task, destructive=False, label=f"power on {p['name']}")
        powered = True
    return call.result(source_vm=p["vm_name"], source_moid=p["vm"], clone={
        "name": clone.name, "moid": clone.moid, "folder": clone.folder, "resource_pool": clone.resource_pool,
        "host": clone.host}, powered_on=powered)
