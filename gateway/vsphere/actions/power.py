"""Power operations: power on, power off (guest shutdown first when VMware Tools runs), suspend, reset."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any

import pyVmomi

from gateway import errors
from gateway.vocabulary import Plan, Precondition, ProgressFn
from gateway.vsphere.actions.execution import Execution, _executor, _power_state
from gateway.vsphere.actions.planning import (
    Args,
    _label,
    _on,
    _read,
    _resolve_vm,
    _state_after_policy,
    _target,
    _vm_params,
    vm_affected,
)
from gateway.vsphere.task_waiter import watch

vim: Any = pyVmomi.vim  # pyVmomi's constructors are untyped
DEFAULT_GUEST_TIMEOUT_SECONDS = 120.0


@dataclass(frozen=True)
class PowerOp:
    """One power operation: its task method, the power states it starts from, and what to do instead."""

    verb: str
    method: str
    allowed: frozenset[str]
    remedy: str
POWER_OPS: dict[str, PowerOp] = {
    "power_on": PowerOp("power on", "PowerOnVM_Task", frozenset({"poweredOff", "suspended"}),
                        "it is already powered on"),
    "power_off": PowerOp("power off", "PowerOffVM_Task", frozenset({"poweredOn", "suspended"}),
                         "it is already powered off"),
    "suspend": PowerOp("suspend", "SuspendVM_Task", frozenset({"poweredOn"}),
                       "only a powered-on VM can be suspended"),
    "reset": PowerOp("reset", "ResetVM_Task", frozenset({"poweredOn"}),
                     "only a powered-on VM can be reset; use power_on_vm"),
}


@_state_after_policy
def plan_power(op_name: str, session: Any, args: Args) -> Plan:
    """Plan a power operation: the VM must be usable; not being a template and being in a state the
    operation starts from are preconditions (``Plan.unmet``), answered after the call is authorized."""
    op = POWER_OPS[op_name]
    vm = _resolve_vm(session, args, op.verb)
    unmet: tuple[Precondition, ...] = ()
    if vm.template:
        unmet = (Precondition(f"{_label(vm)} is a template; templates have no power state to change",
                              {"target": _target(session), "moid": vm.moid}),)
    elif vm.power_state not in op.allowed:
        unmet = (Precondition(
            f"cannot {op.verb} {_label(vm)} on target '{_target(session)}': it is {vm.power_state}; "
            f"{op.remedy}",
            {"target": _target(session), "moid": vm.moid, "power_state": vm.power_state}),)
    params = _vm_params(vm, args)
    if op_name == "power_off":
        guest = args.get("guest_timeout_seconds", DEFAULT_GUEST_TIMEOUT_SECONDS)
        params["guest_timeout_seconds"] = float(guest)
    return Plan(_on(session, f"{op.verb.capitalize()} {_label(vm)}"), (vm_affected(vm),), params, unmet=unmet)


def execute_power(op_name: str, session: Any, plan: Plan, progress: ProgressFn) -> dict[str, Any]:
    """Run the power operation's task and report the VM's power state afterwards."""
    op = POWER_OPS[op_name]

    def body(call: Execution) -> dict[str, Any]:
        vm = call.vm()
        call.task(getattr(vm, op.method), destructive=False, label=f"{op.verb} {call.params['vm_name']}")
        return call.result(vm=call.params["vm_name"], moid=call.params["vm"], action=op_name,
                           power_state=_power_state(call))

    return _executor(body)(session, plan, progress)


def execute_power_off(session: Any, plan: Plan, progress: ProgressFn) -> dict[str, Any]:
    """Shut the guest down when VMware Tools runs (hard power-off if it is still on after
    ``guest_timeout_seconds``); without running Tools, or from suspended, power off hard at once."""
    return _executor(_power_off)(session, plan, progress)


def _power_off(call: Execution) -> dict[str, Any]:
    moid, name = str(call.params["vm"]), str(call.params["vm_name"])
    props = _read(call.session, vim.VirtualMachine, moid, ("runtime.powerState", "guest.toolsRunningStatus"))
    state, tools = props.get("runtime.powerState"), props.get("guest.toolsRunningStatus")
    done = functools.partial(call.result, vm=name, moid=moid, action="power_off")
    if state == "poweredOff":
        return done(power_state="poweredOff", method="none", note="the VM was already powered off")
    guest_timeout = float(call.params.get("guest_timeout_seconds", DEFAULT_GUEST_TIMEOUT_SECONDS))
    if state == "poweredOn" and tools == "guestToolsRunning" and guest_timeout > 0:
        why = guest_shutdown(call, guest_timeout)
        if why is None:
            return done(power_state="poweredOff", method="guest_shutdown")
        note = f"{why}, so the VM was powered off hard"
    elif state == "suspended":
        note = "the VM was suspended, so it was powered off hard (a suspended guest cannot shut down)"
    elif guest_timeout <= 0:
        note = "guest_timeout_seconds is 0, so the VM was powered off hard without a guest shutdown"
    else:
        note = ("VMware Tools is not running in the guest, so the VM was powered off hard without a guest "
                "shutdown")
    call.task(call.vm().PowerOffVM_Task, destructive=False, label=f"power off {name}")
    return done(power_state=_power_state(call), method="hard_power_off", note=note)


def guest_shutdown(call: Execution, seconds: float) -> str | None:
    """Ask the guest to shut down and wait up to ``seconds`` for the VM to be off.

    Returns None once it is off, else why not (the request refused, or the wait ran out).
    """
    call.progress(0.0, f"asking the guest of {call.params['vm_name']} to shut down")
    try:
        call.invoke(call.vm().ShutdownGuest, destructive=False, what="the guest shutdown request")
    except errors.GatewayError as exc:
        if exc.code == "not_authenticated":
            raise
        return f"the guest shutdown request was refused ({exc.code})"
    props = watch(call.session, call.vm(), vim.VirtualMachine, ("runtime.powerState",),
                  lambda p: p.get("runtime.powerState") == "poweredOff", deadline=time.monotonic() + seconds)
    return None if props is not None else f"the guest did not shut down within {seconds:g}s"
