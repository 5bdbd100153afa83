"""Removing a VM: delete it with its files, or unregister it and keep them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyVmomi

from gateway import errors
from gateway.vocabulary import Plan, Precondition, ProgressFn
from gateway.vsphere.actions.blast import one_vm
from gateway.vsphere.actions.execution import Execution, _executor, _power_state, split_progress
from gateway.vsphere.actions.planning import (
    BROKEN_CONNECTION_STATES,
    Args,
    _label,
    _names_text,
    _on,
    _read,
    _resolve_vm,
    _state_after_policy,
    _target,
    _vm_named,
    _vm_params,
    vm_affected,
)
from gateway.vsphere.resolve import VmRef

vim: Any = pyVmomi.vim  # pyVmomi's constructors are untyped


def _powered_on(session: Any, vms: Sequence[VmRef]) -> tuple[Precondition, ...]:
    """The precondition a delete without ``force_power_off`` needs: every VM powered off. Recorded in the
    plan, answered by the pipeline only after the call was authorized (a denied caller never hears it)."""
    on = [vm for vm in vms if vm.power_state == "poweredOn"]
    if not on:
        return ()
    verb, pronoun = ("are", "them") if len(on) > 1 else ("is", "it")
    return (Precondition(
        f"{_names_text([_label(v) for v in on])} on target '{_target(session)}' {verb} powered on; power "
        f"{pronoun} off first (power_off_vm) or pass force_power_off=true to power {pronoun} off as part "
        "of the delete", {"target": _target(session), "vms": [v.name for v in on]}),)


@_state_after_policy
def plan_delete_vm(session: Any, args: Args) -> Plan:
    """Plan destroying a VM and its files; refuses an orphaned/inaccessible/invalid VM and a powered-on one
    unless ``force_power_off``."""
    vm = _resolve_vm(session, args, "deleting")
    force = bool(args.get("force_power_off", False))
    params = {**_vm_params(vm, args), "force_power_off": force}
    first = "Power off and " if force and vm.power_state == "poweredOn" else ""
    summary = f"{first}PERMANENTLY DELETE {_label(vm)} and its files"
    return Plan(_on(session, summary), (vm_affected(vm),), params,
                unmet=() if force else _powered_on(session, [vm]), blast_radius=one_vm(session, vm))


def _destroy(
    call: Execution, moid: str, name: str, force: bool, progress: ProgressFn | None = None
) -> dict[str, Any]:
    base = progress or call.progress
    powered_off = force and _power_state(call, moid) == "poweredOn"
    if powered_off:
        call.task(call.vm(moid).PowerOffVM_Task, destructive=True, label=f"power off {name}",
                  progress=split_progress(base, 0, 2))
    call.task(call.vm(moid).Destroy_Task, destructive=True, label=f"delete {name}",
              progress=split_progress(base, 1, 2) if powered_off else base)
    return {"vm": name, "moid": moid, "powered_off_first": powered_off}


@_executor
def execute_delete_vm(call: Execution) -> dict[str, Any]:
    p = call.params
    done = _destroy(call, p["vm"], p["vm_name"], bool(p["force_power_off"]))
    return call.result(deleted_vm=p["vm_name"], moid=p["vm"], powered_off_first=done["powered_off_first"])


@_state_after_policy
def plan_unregister_vm(session: Any, args: Args) -> Plan:
    """Plan removing a VM from the inventory while keeping its files (works on orphaned VMs too)."""
    vm = _vm_named(session, str(args["vm"]))
    if vm.power_state == "poweredOn" and vm.connection_state not in BROKEN_CONNECTION_STATES:
        raise errors.InvalidState(f"{_label(vm)} is powered on; power it off first (power_off_vm)",
                                  moid=vm.moid)
    files = _read(session, vim.VirtualMachine, vm.moid, ("config.files.vmPathName",))
    vmx = files.get("config.files.vmPathName")
    params = {**_vm_params(vm, args), "vmx_path": vmx}
    state = f" (connection state {vm.connection_state})" if vm.connection_state != "connected" else ""
    summary = f"Unregister {_label(vm)}{state} from the inventory; its files stay on the datastore"
    return Plan(_on(session, summary), (vm_affected(vm),), params, blast_radius=one_vm(session, vm))


@_executor
def execute_unregister_vm(call: Execution) -> dict[str, Any]:
    p = call.params
    call.invoke(call.vm().UnregisterVM, destructive=True, what=f"unregistering {p['vm_name']}")
    return call.result(unregistered_vm=p["vm_name"], moid=p["vm"], files_kept_at=p.get("vmx_path"),
                       note="the VM's files remain on the datastore; register its .vmx to bring it back")
