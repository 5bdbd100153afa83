"""Every vSphere mutation the gateway performs, each as a ``plan`` and an ``execute`` function.

``plan_*(session, args) -> Plan`` resolves names to objects and reads the facts policy needs,
validating the arguments against the target (a network, datastore or host that does not exist, a
size out of range, a clone name in use) without changing anything: bad input raises
``errors.InvalidArgument`` naming the field. A VM in the wrong state is never raised out of a plan:
every ``plan_*`` is wrapped by ``_state_after_policy``, which turns an ``errors.InvalidState`` into a
recorded precondition (``Plan.unmet``) on the objects resolved so far, so the pipeline answers it only
after the policy allowed the call (a denied caller never hears about object state).
``Plan.params`` holds moids and plain values only, so another process can execute it later.

``execute_*(session, plan, progress) -> dict`` performs the change, follows every task through
``tasks.wait_for_task`` and returns a result naming the target and the objects. Each task gets
``params["timeout_seconds"]`` to finish: past it a write reports ``timeout`` and a destructive
step ``outcome_unknown`` (never retried).

Rules that hold for every tool here:

- A VM whose ``runtime.connectionState`` is orphaned, inaccessible or invalid is refused (a precondition)
  (vSphere disables nearly everything on such a VM and says only "not allowed in the current
  state"); ``unregister_vm`` is the one exception, since it is how such a record is cleared.
- Safety snapshots: when the pipeline sets ``params["auto_snapshot"]`` on a revert-type tool
  (revert_snapshot, bulk revert_to_current_snapshot, remove_disk without ``delete_files``),
  execute first snapshots every affected VM (``gateway-safety-<UTC time>``) and reports them as
  ``safety_snapshots``. If any of them fails, nothing destructive runs. Deletes never take one:
  the snapshot would be destroyed with the VM or the snapshots it was meant to protect.
- Once an execute has started a mutation, a session expiry is reported, not retried: the session
  pool re-runs a call from the start only while nothing has changed yet.
"""

from __future__ import annotations

import contextvars
import functools
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import pyVmomi

from gateway import errors
from gateway.guard import datastore_path
from gateway.guard.patterns import UserRegex, compile_user_regex
from gateway.vocabulary import AffectedObject, Plan, Precondition, ProgressFn
from gateway.vsphere import faults
from gateway.vsphere.collector import (
    Query,
    managed_object,
    object_spec,
    retrieve,
    retrieve_objects,
    sweep,
    traverse,
)
from gateway.vsphere.details import flatten_snapshots, read_snapshot_info
from gateway.vsphere.resolve import (
    DatastoreRef,
    FolderRef,
    FolderTree,
    HostRef,
    NetworkRef,
    VmRef,
    find_vm_by_name,
    folder_matches,
    resolve_datastore,
    resolve_folder,
    resolve_host,
    resolve_network,
    resolve_pool,
    resolve_vm,
    vm_facts,
)
from gateway.vsphere.tasks import wait_for_task, watch

T = TypeVar("T")
vim: Any = pyVmomi.vim  # pyVmomi's constructors are untyped
Args = Mapping[str, Any]

DEFAULT_TIMEOUT_SECONDS = 600.0
DEFAULT_GUEST_TIMEOUT_SECONDS = 120.0
BROKEN_CONNECTION_STATES = frozenset({"orphaned", "inaccessible", "invalid"})
SAFETY_PREFIX = "gateway-safety-"
MAX_NAME_CHARS = 80
KB_PER_GB = 1024 * 1024
_SCSI_UNITS = tuple(u for u in range(16) if u != 7)  # unit 7 is the SCSI controller itself
_IDE_UNITS = (0, 1)
_SUMMARY_NAMES = 10


# --------------------------------------------------------------------------------------------------
# Shared plumbing: reading, resolving arguments, describing objects


def _read(session: Any, vim_type: Any, moid: str, paths: Sequence[str]) -> dict[str, Any]:
    """``paths`` of one object through the PropertyCollector, as pyVmomi values (unset ones absent)."""
    obj = managed_object(session, vim_type, moid)
    objects = retrieve_objects(session, object_spec(obj, {vim_type: tuple(paths)}))
    return next((o.props for o in objects if o.moid == moid), {})


def _moid(value: Any) -> str | None:
    """A reference as a moid, whether the reader already made it one or left a pyVmomi object."""
    if value is None or isinstance(value, str):
        return value
    return str(value._moId)


def _moids(values: Sequence[Any] | None) -> list[str]:
    return [m for m in map(_moid, values or ()) if m is not None]


def _argument(field: str, resolve: Callable[[Any, str], T], session: Any, ref: str) -> T:
    """Resolve an object an argument names; a name that does not exist is a bad argument."""
    try:
        return resolve(session, ref)
    except errors.NotFound as exc:
        raise errors.InvalidArgument(field, exc.message) from None
    except errors.Ambiguous as exc:
        exc.details["field"] = field
        raise


def _target(session: Any) -> str:
    return str(session.target.name)


def _on(session: Any, text: str) -> str:
    return f"{text} on target '{_target(session)}'"


def _label(vm: VmRef) -> str:
    return f"VM '{vm.name}' ({vm.moid})"


def vm_affected(vm: VmRef) -> AffectedObject:
    """The policy-facing description of a VM a change touches."""
    return AffectedObject("vm", vm.name, vm.moid, vm.folder, vm.resource_pool, vm.connection_state)


#: the VMs a running plan function resolved so far (``_state_after_policy`` reads them)
_resolved: contextvars.ContextVar[list[VmRef] | None] = contextvars.ContextVar("_resolved", default=None)
PlanFn = TypeVar("PlanFn", bound=Callable[..., Plan])


def _note_resolved(*vms: VmRef) -> None:
    seen = _resolved.get()
    if seen is not None:
        seen.extend(vms)


#: errors a plan raises about what it found on resolved VMs (their disks, snapshots, devices, hosts)
_ABOUT_RESOLVED = (errors.InvalidArgument, errors.Ambiguous, errors.NotFound)


def _state_after_policy(fn: PlanFn) -> PlanFn:
    """Run a plan function; an ``errors.InvalidState`` it raises becomes ``Plan.unmet`` on the VMs it
    had resolved, so the state is answered after the policy decided on those objects (never before).
    So does a bad argument found once a VM was resolved (a disk or snapshot the VM does not have, a
    datastore its host does not mount: messages that list what the VM has), with its own code."""

    @functools.wraps(fn)
    def plan(*args: Any, **kwargs: Any) -> Plan:
        seen: list[VmRef] = []
        token = _resolved.set(seen)
        try:
            return fn(*args, **kwargs)
        except (errors.InvalidState, *_ABOUT_RESOLVED) as exc:
            if isinstance(exc, _ABOUT_RESOLVED) and not seen:
                raise  # about the arguments alone: nothing of a VM to hide from the policy
            vms = list({vm.moid: vm for vm in seen}.values())
            names = ", ".join(_label(vm) for vm in vms[:_SUMMARY_NAMES]) or "the named objects"
            return Plan(f"Change {names} (not possible in their current state)",
                        tuple(vm_affected(vm) for vm in vms), {}, object_count=len(vms) or None,
                        unmet=(Precondition(exc.message, dict(exc.details), exc.code),))
        finally:
            _resolved.reset(token)

    return plan  # type: ignore[return-value]


def _vm_params(vm: VmRef, args: Args) -> dict[str, Any]:
    return {"vm": vm.moid, "vm_name": vm.name,
            "timeout_seconds": float(args.get("timeout_seconds") or DEFAULT_TIMEOUT_SECONDS)}


def require_usable(session: Any, vm: VmRef, doing: str) -> None:
    """Refuse a VM whose connection state makes vSphere disable the operation."""
    state = vm.connection_state
    if state in BROKEN_CONNECTION_STATES:
        raise errors.InvalidState(
            f"{_label(vm)} on target '{_target(session)}' is {state}: vSphere does not allow {doing} on "
            "such a VM and would answer only 'not allowed in the current state'. If the record is a "
            "leftover, remove it with unregister_vm (its files stay on the datastore)",
            target=_target(session), vm=vm.name, moid=vm.moid, connection_state=state)


def _vm_named(session: Any, ref: str) -> VmRef:
    """The VM ``ref`` names, noted as resolved. A name several VMs carry notes every candidate before
    ``Ambiguous`` (their moids) is raised, so the policy judges them all before the caller hears it."""
    try:
        vm = resolve_vm(session, ref)
    except errors.Ambiguous as exc:
        for moid in list(exc.details.get("candidates") or ())[:_SUMMARY_NAMES]:
            try:
                _note_resolved(vm_facts(session, moid))
            except pyVmomi.vmodl.fault.ManagedObjectNotFound:
                continue  # gone meanwhile: nothing to judge
        raise
    _note_resolved(vm)
    return vm


def _resolve_vm(session: Any, args: Args, doing: str) -> VmRef:
    vm = _vm_named(session, str(args["vm"]))
    require_usable(session, vm, doing)
    return vm


def _names_text(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_SUMMARY_NAMES])
    more = len(names) - _SUMMARY_NAMES
    return f"{shown} and {more} more" if more > 0 else shown


_VSPHERE_ESCAPES = re.compile(r"%(?:2[fF]|5[cC]|25)|[/\\%]")
_ESCAPED = {"/": "%2f", "\\": "%5c", "%": "%25"}


def vsphere_name(name: str) -> str:
    """``name`` as vSphere stores an entity name: ``/`` as ``%2f``, ``\\`` as ``%5c`` and ``%`` as ``%25``,
    except a ``%`` that already starts one of those escapes. Sending the escaped form makes the target
    store exactly what it would have stored anyway, and lets the gateway check and report the name
    the object will really carry (the simulator does not escape, and breaks on a ``/``)."""
    return _VSPHERE_ESCAPES.sub(lambda m: _ESCAPED.get(m.group(0), m.group(0)), name)


def _check_name(field: str, name: str) -> str:
    name = name.strip()
    if not name or len(name) > MAX_NAME_CHARS:
        raise errors.InvalidArgument(field, f"must be 1 to {MAX_NAME_CHARS} characters")
    if any(ord(ch) < 32 for ch in name):
        raise errors.InvalidArgument(field, "must not contain control characters")
    return name


# --------------------------------------------------------------------------------------------------
# Executing: one Execution per execute carries the session, plan, progress and what has changed so far


class Execution:
    """The state of one execute: its plan, progress relay, task timeout and whether it changed anything."""

    def __init__(self, session: Any, plan: Plan, progress: ProgressFn) -> None:
        self.session = session
        self.plan = plan
        self.params = plan.params
        self.progress = progress
        self.target = _target(session)
        self.timeout = float(self.params.get("timeout_seconds") or DEFAULT_TIMEOUT_SECONDS)
        self.mutated = False
        self.stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")

    def obj(self, vim_type: Any, moid: str) -> Any:
        return managed_object(self.session, vim_type, moid)

    def vm(self, moid: str | None = None) -> Any:
        return self.obj(vim.VirtualMachine, moid or str(self.params["vm"]))

    def invoke(self, method: Callable[..., T], *args: Any, destructive: bool, what: str, **kwargs: Any) -> T:
        """Start one mutation (a task or a synchronous call).

        Before anything has changed, a session expiry propagates untranslated so the pool logs in again
        and re-runs the execute; afterwards every fault is translated here. A call whose answer is lost
        (a timeout, a dropped connection: the request may have reached the target) has an unknown
        outcome, never ``unreachable``; only a connection that was never set up stays ``unreachable``
        (for a destructive call even that is reported as unknown).
        """
        first = not self.mutated
        self.mutated = True
        try:
            return method(*args, **kwargs)
        except vim.fault.NotAuthenticated as exc:
            if first:
                self.mutated = False
                raise
            raise faults.translate(exc, self.target) from exc
        except Exception as exc:
            if not faults.is_foreign(exc):
                raise
            error = faults.translate(exc, self.target)
            arrived = faults.request_may_have_arrived(exc)
            if first and not arrived:
                self.mutated = False  # never sent: nothing changed
            if error.code in ("timeout", "unreachable") and (destructive or arrived):
                raise errors.OutcomeUnknown(
                    f"target '{self.target}': the answer to {what} was lost ({error.code}); it may have "
                    "taken effect. Do not retry: read the affected objects again (or get_tasks) to see what "
                    "happened",
                    target=self.target, cause=error.code) from exc
            raise error from exc

    def task(self, method: Callable[..., Any], *args: Any, destructive: bool, label: str,
             progress: ProgressFn | None = None, **kwargs: Any) -> Any:
        """Start a task and wait for it (``timeout_seconds`` from now); return its result."""
        task = self.invoke(method, *args, destructive=destructive, what=label, **kwargs)
        return wait_for_task(self.session, task, deadline=time.monotonic() + self.timeout,
                             progress=progress or self.progress, destructive=destructive, label=label)

    def share(self, index: int, count: int) -> ProgressFn:
        """A progress function for step ``index`` of ``count`` equal steps of this call."""
        return split_progress(self.progress, index, count)

    def result(self, **fields: Any) -> dict[str, Any]:
        return {"target": self.target, **fields}


def split_progress(progress: ProgressFn, index: int, count: int) -> ProgressFn:
    """Report step ``index`` of ``count`` equal steps as its share of ``progress``'s 0..1."""
    def relay(fraction: float, message: str) -> None:
        progress((index + fraction) / count, message)
    return relay


ExecuteFn = Callable[[Any, Plan, ProgressFn], dict[str, Any]]


def _executor(body: Callable[[Execution], dict[str, Any]]) -> ExecuteFn:
    """Adapt ``body(call)`` to the ``execute(session, plan, progress)`` contract of ``ToolSpec``."""
    @functools.wraps(body)
    def execute(session: Any, plan: Plan, progress: ProgressFn) -> dict[str, Any]:
        call = Execution(session, plan, progress)
        try:
            return body(call)
        except vim.fault.NotAuthenticated as exc:
            if not call.mutated:
                raise
            raise faults.translate(exc, call.target) from exc
        except (errors.Unreachable, errors.Timeout) as exc:
            # A read after the change (the clone's facts, a power state) lost the connection: the change
            # itself was made or is under way, so "worth a retry" would be a lie.
            if not call.mutated or "task" in exc.details:
                raise
            raise errors.OutcomeUnknown(
                f"target '{call.target}': the connection was lost after the change was sent ({exc.code}); "
                "it may have taken effect. Do not retry: read the affected objects again (or get_tasks) "
                "to see what happened", target=call.target, cause=exc.code) from exc
    return execute


def _power_state(call: Execution, moid: str | None = None) -> str | None:
    moid = moid or str(call.params["vm"])
    state = _read(call.session, vim.VirtualMachine, moid, ("runtime.powerState",)).get("runtime.powerState")
    return str(state) if state is not None else None


# --------------------------------------------------------------------------------------------------
# Power


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


# --------------------------------------------------------------------------------------------------
# Snapshots (create; the destructive ones are further down)


def _snapshot_rows(session: Any, vm: VmRef) -> tuple[list[dict[str, Any]], str | None]:
    info = read_snapshot_info(session, vm.moid)
    current = _moid(info.currentSnapshot) if info is not None else None
    return flatten_snapshots(info.rootSnapshotList if info is not None else [], current), current


@_state_after_policy
def plan_create_snapshot(session: Any, args: Args) -> Plan:
    """Plan a snapshot: a usable VM and a name no other snapshot of it has (names address snapshots later)."""
    vm = _resolve_vm(session, args, "taking a snapshot")
    name = _check_name("name", str(args["name"]))
    rows, _current = _snapshot_rows(session, vm)
    taken = [r["moid"] for r in rows if r["name"] == name]
    if taken:
        raise errors.InvalidArgument(
            "name", f"{_label(vm)} already has a snapshot named '{name}' ({taken[0]}); pick another name so "
            "that deleting or reverting by name stays unambiguous")
    memory, quiesce = bool(args.get("memory", False)), bool(args.get("quiesce", False))
    params = {**_vm_params(vm, args), "name": name, "description": str(args.get("description") or ""),
              "memory": memory, "quiesce": quiesce}
    how = [w for w, on in (("with memory", memory), ("quiesced", quiesce)) if on]
    summary = f"Take snapshot '{name}' of {_label(vm)}" + (f" ({', '.join(how)})" if how else "")
    return Plan(_on(session, summary), (vm_affected(vm),), params)


@_executor
def execute_create_snapshot(call: Execution) -> dict[str, Any]:
    """Take the snapshot; the result names it and its moid."""
    p = call.params
    ref = call.task(call.vm().CreateSnapshot_Task, destructive=False, label=f"snapshot {p['vm_name']}",
                    name=p["name"], description=p["description"], memory=p["memory"], quiesce=p["quiesce"])
    return call.result(vm=p["vm_name"], moid=p["vm"], snapshot={"name": p["name"], "moid": _moid(ref)})


# --------------------------------------------------------------------------------------------------
# Reconfigure: CPU, memory, one new disk, one new NIC; nothing else


_VM_CONFIG_PATHS = (
    "config.hardware.numCPU", "config.hardware.memoryMB", "config.cpuHotAddEnabled",
    "config.cpuHotRemoveEnabled", "config.memoryHotAddEnabled", "config.hardware.device",
    "config.files.vmPathName",
)
_HOST_PATHS = ("name", "summary.hardware.numCpuThreads", "summary.hardware.memorySize", "network",
               "datastore")
_DATASTORE_PATH = re.compile(r"^\[(?P<datastore>[^\[\]]+)\]\s*(?P<path>\S.*)$")


@dataclass(frozen=True)
class _VmConfig:
    cpus: int
    memory_mb: int
    cpu_hot_add: bool
    cpu_hot_remove: bool
    memory_hot_add: bool
    devices: list[Any]
    home_datastore: str | None


def _vm_config(session: Any, moid: str) -> _VmConfig:
    p = _read(session, vim.VirtualMachine, moid, _VM_CONFIG_PATHS)
    home = _DATASTORE_PATH.match(p.get("config.files.vmPathName") or "")
    return _VmConfig(
        cpus=int(p.get("config.hardware.numCPU") or 0), memory_mb=int(p.get("config.hardware.memoryMB") or 0),
        cpu_hot_add=bool(p.get("config.cpuHotAddEnabled")),
        cpu_hot_remove=bool(p.get("config.cpuHotRemoveEnabled")),
        memory_hot_add=bool(p.get("config.memoryHotAddEnabled")),
        devices=list(p.get("config.hardware.device") or []),
        home_datastore=home.group("datastore") if home else None)


def _host_facts(session: Any, host_moid: str | None) -> dict[str, Any]:
    if host_moid is None:
        return {}
    p = _read(session, vim.HostSystem, host_moid, _HOST_PATHS)
    return {"name": p.get("name", host_moid), "threads": p.get("summary.hardware.numCpuThreads"),
            "memory_mb": (p.get("summary.hardware.memorySize") or 0) // (1024 * 1024) or None,
            "networks": set(_moids(p.get("network"))), "datastores": set(_moids(p.get("datastore")))}


@dataclass(frozen=True)
class _HotRule:
    """When a powered-on VM may change a value: growing needs ``grow`` enabled, shrinking ``shrink``."""

    field: str
    what: str
    grow: Callable[[_VmConfig], bool]
    shrink: Callable[[_VmConfig], bool]


_HOT_RULES = (
    _HotRule("cpu_count", "CPU count", lambda c: c.cpu_hot_add, lambda c: c.cpu_hot_remove),
    _HotRule("memory_mb", "memory", lambda c: c.memory_hot_add, lambda _c: False),
)


def _check_hot_change(vm: VmRef, config: _VmConfig, rule: _HotRule, old: int, new: int) -> None:
    if vm.power_state != "poweredOn":
        return
    allowed = rule.grow(config) if new > old else rule.shrink(config)
    if not allowed:
        direction = "raise" if new > old else "lower"
        raise errors.InvalidState(
            f"cannot {direction} the {rule.what} of {_label(vm)} while it is powered on: hot "
            f"{'add' if new > old else 'remove'} is not enabled for it; power it off first (power_off_vm)",
            moid=vm.moid, field=rule.field)


def _plan_cpu_memory(
    vm: VmRef, config: _VmConfig, host: Mapping[str, Any], args: Args
) -> tuple[dict[str, Any], list[str]]:
    params: dict[str, Any] = {}
    words: list[str] = []
    for rule, key, current, limit, unit in (
        (_HOT_RULES[0], "cpu_count", config.cpus, host.get("threads"), "logical CPUs"),
        (_HOT_RULES[1], "memory_mb", config.memory_mb, host.get("memory_mb"), "MB of memory"),
    ):
        value = args.get(key)
        if value is None:
            continue
        if key == "memory_mb" and value % 4:
            raise errors.InvalidArgument(key, "must be a multiple of 4 MB")
        if value == current:
            raise errors.InvalidArgument(key, f"{_label(vm)} already has {value}; give another value")
        if limit and value > limit:
            raise errors.InvalidArgument(key, f"{value} exceeds the {limit} {unit} of host '{host['name']}'")
        _check_hot_change(vm, config, rule, current, value)
        params[key] = int(value)
        words.append(f"{rule.what} {current} -> {value}" + (" MB" if key == "memory_mb" else ""))
    return params, words


def _free_slot(devices: Sequence[Any], controller_type: Any, units: Sequence[int]) -> tuple[int, int] | None:
    """The first (controller key, unit number) free on a controller of ``controller_type``."""
    for controller in sorted((d for d in devices if isinstance(d, controller_type)), key=lambda d: d.key):
        used = {d.unitNumber for d in devices if d.controllerKey == controller.key}
        free = next((u for u in units if u not in used), None)
        if free is not None:
            return controller.key, free
    return None


def _datastore_on_host(session: Any, field: str, ref: str, host: Mapping[str, Any]) -> DatastoreRef:
    ds = _argument(field, resolve_datastore, session, ref)
    if ds.accessible is False:
        raise errors.InvalidArgument(field, f"datastore '{ds.name}' is not accessible")
    if host and ds.moid not in host["datastores"]:
        raise errors.InvalidArgument(field, f"datastore '{ds.name}' is not mounted on host '{host['name']}'")
    return ds


def _plan_disk(
    session: Any, vm: VmRef, config: _VmConfig, host: Mapping[str, Any], args: Args
) -> dict[str, Any]:
    size_gb = int(args["add_disk_gb"])
    ref = args.get("datastore") or config.home_datastore
    if ref is None:
        raise errors.InvalidArgument("datastore", f"{_label(vm)} has no home datastore to default to")
    ds = _datastore_on_host(session, "datastore", str(ref), host)
    if ds.free_bytes is not None and size_gb * 1024**3 > ds.free_bytes:
        raise errors.InvalidArgument(
            "add_disk_gb",
            f"{size_gb} GB exceeds the {ds.free_bytes // 1024**3} GB free on datastore '{ds.name}'")
    slot = _free_slot(config.devices, vim.vm.device.VirtualSCSIController, _SCSI_UNITS)
    if slot is None:
        raise errors.InvalidState(f"{_label(vm)} has no SCSI controller with a free slot for another disk",
                                  moid=vm.moid)
    return {"size_gb": size_gb, "datastore": ds.moid, "datastore_name": ds.name,
            "controller_key": slot[0], "unit_number": slot[1]}


def _plan_nic(session: Any, vm: VmRef, host: Mapping[str, Any], ref: str) -> dict[str, Any]:
    net = _argument("add_nic_network", resolve_network, session, ref)
    if host and net.moid not in host["networks"]:
        raise errors.InvalidArgument(
            "add_nic_network", f"network '{net.name}' is not available on host '{host['name']}' where "
            f"{_label(vm)} runs")
    nic: dict[str, Any] = {"network": net.moid, "network_name": net.name, "type": net.type}
    if net.type == "dvs.DistributedVirtualPortgroup":
        nic.update(_portgroup_facts(session, net))
    elif net.type != "Network":
        raise errors.InvalidArgument("add_nic_network", f"network '{net.name}' is a {net.type}; only "
                                     "standard networks and distributed port groups are supported")
    return nic


def _portgroup_facts(session: Any, net: NetworkRef) -> dict[str, Any]:
    p = _read(session, vim.dvs.DistributedVirtualPortgroup, net.moid,
              ("key", "config.distributedVirtualSwitch", "config.uplink"))
    if p.get("config.uplink"):
        raise errors.InvalidArgument("add_nic_network", f"'{net.name}' is an uplink port group, not for VMs")
    switch = _moid(p.get("config.distributedVirtualSwitch"))
    if switch is None:
        raise errors.InvalidArgument("add_nic_network", f"port group '{net.name}' has no distributed switch")
    dvs = _read(session, vim.DistributedVirtualSwitch, switch, ("uuid", "config.uplinkPortgroup"))
    if net.moid in _moids(dvs.get("config.uplinkPortgroup")):
        raise errors.InvalidArgument("add_nic_network", f"'{net.name}' is an uplink port group, not for VMs")
    uuid = dvs.get("uuid")
    return {"portgroup_key": p.get("key") or net.moid, "switch_uuid": uuid}


@_state_after_policy
def plan_reconfigure(session: Any, args: Args) -> Plan:
    """Plan CPU/memory changes, one new disk and one new NIC, each checked against the VM and its host."""
    if args.get("datastore") is not None and args.get("add_disk_gb") is None:
        raise errors.InvalidArgument("datastore", "only used with add_disk_gb (where to create the new disk)")
    if all(args.get(k) is None for k in ("cpu_count", "memory_mb", "add_disk_gb", "add_nic_network")):
        raise errors.InvalidArgument("arguments", "give at least one of cpu_count, memory_mb, add_disk_gb, "
                                     "add_nic_network")
    vm = _resolve_vm(session, args, "reconfiguring")
    config = _vm_config(session, vm.moid)
    host = _host_facts(session, vm.host_moid)
    params, words = _plan_cpu_memory(vm, config, host, args)
    if args.get("add_disk_gb") is not None:
        params["disk"] = _plan_disk(session, vm, config, host, args)
        disk = params["disk"]
        words.append(f"add a {disk['size_gb']} GB disk on datastore '{disk['datastore_name']}'")
    if args.get("add_nic_network") is not None:
        params["nic"] = _plan_nic(session, vm, host, str(args["add_nic_network"]))
        words.append(f"add a network adapter on '{params['nic']['network_name']}'")
    params.update(_vm_params(vm, args))
    return Plan(_on(session, f"Reconfigure {_label(vm)}: {'; '.join(words)}"), (vm_affected(vm),), params)


def _disk_spec(call: Execution, disk: Mapping[str, Any]) -> Any:
    backing = vim.vm.device.VirtualDisk.FlatVer2BackingInfo(
        fileName=f"[{disk['datastore_name']}]", diskMode="persistent", thinProvisioned=True,
        datastore=call.obj(vim.Datastore, disk["datastore"]))
    device = vim.vm.device.VirtualDisk(
        key=-101, controllerKey=disk["controller_key"], unitNumber=disk["unit_number"],
        capacityInKB=disk["size_gb"] * KB_PER_GB, backing=backing)
    return vim.vm.device.VirtualDeviceSpec(operation="add", fileOperation="create", device=device)


def _nic_backing(call: Execution, nic: Mapping[str, Any]) -> Any:
    if nic["type"] == "Network":
        return vim.vm.device.VirtualEthernetCard.NetworkBackingInfo(
            deviceName=nic["network_name"], network=call.obj(vim.Network, nic["network"]))
    port = vim.dvs.PortConnection(switchUuid=nic["switch_uuid"], portgroupKey=nic["portgroup_key"])
    return vim.vm.device.VirtualEthernetCard.DistributedVirtualPortBackingInfo(port=port)


def _nic_spec(call: Execution, nic: Mapping[str, Any]) -> Any:
    device = vim.vm.device.VirtualVmxnet3(
        key=-102, addressType="generated", backing=_nic_backing(call, nic),
        connectable=vim.vm.device.VirtualDevice.ConnectInfo(startConnected=True, connected=True,
                                                            allowGuestControl=True))
    return vim.vm.device.VirtualDeviceSpec(operation="add", device=device)


def _device_row(device: Any) -> dict[str, Any]:
    info = device.deviceInfo
    return {"label": info.label if info is not None else str(device.key), "key": device.key,
            "file": getattr(device.backing, "fileName", None)}


@_executor
def execute_reconfigure(call: Execution) -> dict[str, Any]:
    """Apply the planned changes in one ReconfigVM_Task; report the devices it added."""
    p = call.params
    spec = vim.vm.ConfigSpec()
    if "cpu_count" in p:
        spec.numCPUs = p["cpu_count"]
    if "memory_mb" in p:
        spec.memoryMB = p["memory_mb"]
    spec.deviceChange = ([_disk_spec(call, p["disk"])] if "disk" in p else []) + (
        [_nic_spec(call, p["nic"])] if "nic" in p else [])
    before = {d.key for d in _vm_config(call.session, p["vm"]).devices}
    call.task(call.vm().ReconfigVM_Task, destructive=False, label=f"reconfigure {p['vm_name']}", spec=spec)
    after = _vm_config(call.session, p["vm"])
    added = [_device_row(d) for d in after.devices if d.key not in before]
    return call.result(vm=p["vm_name"], moid=p["vm"], cpu_count=after.cpus, memory_mb=after.memory_mb,
                       added_devices=added)


# --------------------------------------------------------------------------------------------------
# ISO images


def parse_iso_path(value: str) -> tuple[str, str]:
    """``"[datastore] folder/image.iso"`` -> (datastore, canonical path inside it), by
    ``guard.datastore_path`` (no ``..`` out of the datastore); InvalidArgument("iso_path") otherwise."""
    found = datastore_path.iso_path(value)
    return found.datastore, found.path


def _cdroms(devices: Sequence[Any]) -> list[Any]:
    return sorted((d for d in devices if isinstance(d, vim.vm.device.VirtualCdrom)), key=lambda d: d.key)


@_state_after_policy
def plan_mount_iso(session: Any, args: Args) -> Plan:
    """Plan inserting an ISO: the datastore must exist and be mounted on the VM's host; the first CD-ROM
    drive is used, or a new one is added on a free IDE slot."""
    ds_name, path = parse_iso_path(str(args["iso_path"]))
    vm = _resolve_vm(session, args, "changing CD-ROM media")
    host = _host_facts(session, vm.host_moid)
    ds = _datastore_on_host(session, "iso_path", ds_name, host)
    config = _vm_config(session, vm.moid)
    params = {**_vm_params(vm, args), "iso_path": f"[{ds.name}] {path}", "datastore": ds.moid}
    drives = _cdroms(config.devices)
    if drives:
        params["cdrom_key"] = drives[0].key
        where = f"in {drives[0].deviceInfo.label if drives[0].deviceInfo else 'its CD-ROM drive'}"
    else:
        slot = _free_slot(config.devices, vim.vm.device.VirtualIDEController, _IDE_UNITS)
        if slot is None:
            raise errors.InvalidState(f"{_label(vm)} has no CD-ROM drive and no free IDE slot to add one",
                                      moid=vm.moid)
        params["controller_key"], params["unit_number"] = slot
        where = "in a new CD-ROM drive"
    summary = f"Mount ISO '{params['iso_path']}' {where} of {_label(vm)}"
    return Plan(_on(session, summary), (vm_affected(vm),), params)


def _iso_backing(call: Execution) -> Any:
    return vim.vm.device.VirtualCdrom.IsoBackingInfo(
        fileName=call.params["iso_path"], datastore=call.obj(vim.Datastore, call.params["datastore"]))


def _connected(connected: bool) -> Any:
    return vim.vm.device.VirtualDevice.ConnectInfo(startConnected=connected, connected=connected,
                                                   allowGuestControl=True)


def _device_by_key(call: Execution, key: int) -> Any:
    device = next((d for d in _vm_config(call.session, call.params["vm"]).devices if d.key == key), None)
    if device is None:
        raise errors.NotFound(f"{call.params['vm_name']} no longer has the device with key {key}; plan again",
                              target=call.target, moid=call.params["vm"])
    return device


@_executor
def execute_mount_iso(call: Execution) -> dict[str, Any]:
    """Point the CD-ROM drive at the ISO (connected), adding the drive first if the plan says so."""
    p = call.params
    if "cdrom_key" in p:
        device = _device_by_key(call, int(p["cdrom_key"]))
        operation = "edit"
    else:
        device = vim.vm.device.VirtualCdrom(
            key=-103, controllerKey=p["controller_key"], unitNumber=p["unit_number"])
        operation = "add"
    device.backing = _iso_backing(call)
    device.connectable = _connected(True)
    change = vim.vm.device.VirtualDeviceSpec(operation=operation, device=device)
    spec = vim.vm.ConfigSpec(deviceChange=[change])
    call.task(call.vm().ReconfigVM_Task, destructive=False, label=f"mount ISO on {p['vm_name']}", spec=spec)
    return call.result(vm=p["vm_name"], moid=p["vm"], iso_path=p["iso_path"], cdrom_added=operation == "add")


@_state_after_policy
def plan_unmount_iso(session: Any, args: Args) -> Plan:
    """Plan ejecting every ISO image mounted on the VM; a VM with none is refused."""
    vm = _resolve_vm(session, args, "changing CD-ROM media")
    drives = [d for d in _cdroms(_vm_config(session, vm.moid).devices)
              if isinstance(d.backing, vim.vm.device.VirtualCdrom.IsoBackingInfo)]
    if not drives:
        raise errors.InvalidState(f"{_label(vm)} has no ISO image mounted; nothing to unmount", moid=vm.moid)
    isos = [d.backing.fileName for d in drives]
    params = {**_vm_params(vm, args), "cdrom_keys": [d.key for d in drives], "isos": isos}
    summary = f"Unmount {', '.join(repr(i) for i in isos)} from {_label(vm)}"
    return Plan(_on(session, summary), (vm_affected(vm),), params)


@_executor
def execute_unmount_iso(call: Execution) -> dict[str, Any]:
    """Leave each planned drive empty (client device, disconnected)."""
    p = call.params
    changes = []
    for key in p["cdrom_keys"]:
        device = _device_by_key(call, int(key))
        device.backing = vim.vm.device.VirtualCdrom.RemotePassthroughBackingInfo(
            deviceName="", exclusive=False, useAutoDetect=False)
        device.connectable = _connected(False)
        changes.append(vim.vm.device.VirtualDeviceSpec(operation="edit", device=device))
    call.task(call.vm().ReconfigVM_Task, destructive=False, label=f"unmount ISO from {p['vm_name']}",
              spec=vim.vm.ConfigSpec(deviceChange=changes))
    return call.result(vm=p["vm_name"], moid=p["vm"], unmounted=p["isos"])


# --------------------------------------------------------------------------------------------------
# Migrate (RelocateVM_Task) and clone, within one target


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


# --------------------------------------------------------------------------------------------------
# Safety snapshots


@dataclass(frozen=True)
class SafetyTarget:
    vm_moid: str
    vm_name: str


def safety_snapshots(call: Execution, vms: Sequence[SafetyTarget], before: str) -> list[dict[str, Any]]:
    """Snapshot every VM (without memory) before ``before``; all or nothing.

    If any snapshot fails, raise ``TaskFailed`` naming every VM that failed and every snapshot already
    taken (they are kept: removing them is a separate decision), so the caller runs nothing destructive.
    """
    name = SAFETY_PREFIX + call.stamp
    taken: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    for index, vm in enumerate(vms):
        try:
            ref = call.task(call.vm(vm.vm_moid).CreateSnapshot_Task, destructive=False,
                            label=f"safety snapshot of {vm.vm_name}",
                            progress=call.share(index, 2 * len(vms)),
                            name=name, description=f"Taken by the gateway before {before}", memory=False,
                            quiesce=False)
        except errors.GatewayError as exc:
            failed.append({"vm": vm.vm_name, "moid": vm.vm_moid, "code": exc.code, "message": exc.message})
            continue
        taken.append({"vm": vm.vm_name, "vm_moid": vm.vm_moid, "name": name, "moid": _moid(ref),
                      "target": call.target})
    if failed:
        raise _safety_failed(call.target, before, failed, taken)
    return taken


def _safety_failed(target: str, before: str, failed: list[dict[str, Any]],
                   taken: list[dict[str, Any]]) -> errors.TaskFailed:
    who = "; ".join(f"{f['vm']} ({f['moid']}): {f['message']}" for f in failed)
    kept = ", ".join(f"{t['name']} ({t['moid']}) of {t['vm']}" for t in taken) or "none"
    return errors.TaskFailed(
        f"target '{target}': the safety snapshot failed for {len(failed)} VM(s), so nothing was changed "
        f"({before} did not run). Failed: {who}. Safety snapshots already taken (kept; delete them with "
        f"delete_snapshot if unwanted): {kept}",
        target=target, failed=failed, safety_snapshots=taken)


def _maybe_safety(call: Execution, vms: Sequence[SafetyTarget], before: str) -> list[dict[str, Any]]:
    return safety_snapshots(call, vms, before) if call.params.get("auto_snapshot") else []


# --------------------------------------------------------------------------------------------------
# Destructive: snapshots


def _find_snapshot(
    session: Any, vm: VmRef, field: str, ref: str | None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The snapshot ``ref`` names (moid or exact name; None: the current one) and every snapshot row."""
    rows, current = _snapshot_rows(session, vm)
    if ref is None:
        row = next((r for r in rows if r["moid"] == current), None)
        if row is None:
            raise errors.InvalidState(f"{_label(vm)} has no current snapshot to revert to", moid=vm.moid)
        return row, rows
    by_moid = [r for r in rows if r["moid"] == ref]
    matches = by_moid or [r for r in rows if r["name"] == ref]
    if not matches:
        known = ", ".join(f"{r['name']} ({r['moid']})" for r in rows) or "none"
        raise errors.InvalidArgument(field, f"{_label(vm)} has no snapshot named or with moid '{ref}'; "
                                     f"its snapshots: {known}")
    if len(matches) > 1:
        raise errors.Ambiguous(
            f"{len(matches)} snapshots of {_label(vm)} are named '{ref}'; name one by its moid: "
            f"{', '.join(r['moid'] for r in matches)}", field=field, candidates=[r["moid"] for r in matches])
    return matches[0], rows


def _descendants(rows: Sequence[dict[str, Any]], moid: str) -> list[dict[str, Any]]:
    children = [r for r in rows if r["parent"] == moid]
    return [d for c in children for d in (c, *_descendants(rows, c["moid"]))]


def _snapshot_affected(row: Mapping[str, Any]) -> AffectedObject:
    return AffectedObject("snapshot", row["name"], row["moid"])


@_state_after_policy
def plan_delete_snapshot(session: Any, args: Args) -> Plan:
    """Plan removing one snapshot (its children too with ``remove_children``); the disk state is kept."""
    vm = _resolve_vm(session, args, "removing snapshots")
    row, rows = _find_snapshot(session, vm, "snapshot", str(args["snapshot"]))
    children = _descendants(rows, row["moid"]) if args.get("remove_children") else []
    gone = [row, *children]
    params = {**_vm_params(vm, args), "snapshot": row["moid"], "remove_children": bool(children),
              "snapshots": [{"name": r["name"], "moid": r["moid"]} for r in gone]}
    extra = f" and its {len(children)} child snapshot(s)" if children else ""
    summary = f"PERMANENTLY DELETE snapshot '{row['name']}' ({row['moid']}){extra} of {_label(vm)}"
    return Plan(_on(session, summary), (vm_affected(vm), *map(_snapshot_affected, gone)), params)


@_executor
def execute_delete_snapshot(call: Execution) -> dict[str, Any]:
    p = call.params
    snapshot = call.obj(vim.vm.Snapshot, p["snapshot"])
    call.task(snapshot.RemoveSnapshot_Task, destructive=True, label=f"delete snapshot of {p['vm_name']}",
              removeChildren=p["remove_children"], consolidate=True)
    return call.result(vm=p["vm_name"], moid=p["vm"], deleted_snapshots=p["snapshots"])


@_state_after_policy
def plan_revert_snapshot(session: Any, args: Args) -> Plan:
    """Plan reverting to a named snapshot or the current one (resolved to its moid now, so a safety snapshot
    taken at execute time, which becomes the current one, does not change what is reverted to)."""
    vm = _resolve_vm(session, args, "reverting to a snapshot")
    ref = args.get("snapshot")
    row, _rows = _find_snapshot(session, vm, "snapshot", str(ref) if ref is not None else None)
    params = {**_vm_params(vm, args), "snapshot": row["moid"], "snapshot_name": row["name"]}
    summary = (f"Revert {_label(vm)} to snapshot '{row['name']}' ({row['moid']}), discarding every change "
               "made since it was taken")
    return Plan(_on(session, summary), (vm_affected(vm), _snapshot_affected(row)), params)


@_executor
def execute_revert_snapshot(call: Execution) -> dict[str, Any]:
    p = call.params
    safety = _maybe_safety(call, [SafetyTarget(p["vm"], p["vm_name"])], "revert_snapshot")
    snapshot = call.obj(vim.vm.Snapshot, p["snapshot"])
    call.task(snapshot.RevertToSnapshot_Task, destructive=True, label=f"revert {p['vm_name']}",
              progress=call.share(1, 2) if safety else None)
    reverted = {"name": p["snapshot_name"], "moid": p["snapshot"]}
    return call.result(vm=p["vm_name"], moid=p["vm"], reverted_to=reverted, power_state=_power_state(call),
                       safety_snapshots=safety)


# --------------------------------------------------------------------------------------------------
# Destructive: delete, unregister, remove a disk


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
                unmet=() if force else _powered_on(session, [vm]))


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
    return Plan(_on(session, summary), (vm_affected(vm),), params)


@_executor
def execute_unregister_vm(call: Execution) -> dict[str, Any]:
    p = call.params
    call.invoke(call.vm().UnregisterVM, destructive=True, what=f"unregistering {p['vm_name']}")
    return call.result(unregistered_vm=p["vm_name"], moid=p["vm"], files_kept_at=p.get("vmx_path"),
                       note="the VM's files remain on the datastore; register its .vmx to bring it back")


def _find_disk(vm: VmRef, devices: Sequence[Any], ref: str) -> Any:
    disks = [d for d in devices if isinstance(d, vim.vm.device.VirtualDisk)]
    for disk in disks:
        label = disk.deviceInfo.label if disk.deviceInfo is not None else None
        if ref == label or (ref.isdigit() and int(ref) == disk.key):
            return disk
    known = ", ".join(f"{_device_row(d)['label']} (key {d.key})" for d in disks) or "none"
    raise errors.InvalidArgument("disk", f"{_label(vm)} has no disk labelled or keyed '{ref}'; its disks: "
                                 f"{known}")


@_state_after_policy
def plan_remove_disk(session: Any, args: Args) -> Plan:
    """Plan detaching one disk by label ("Hard disk 2") or device key; ``delete_files`` also destroys it."""
    vm = _resolve_vm(session, args, "removing a disk")
    disk = _find_disk(vm, _vm_config(session, vm.moid).devices, str(args["disk"]))
    row = _device_row(disk)
    delete = bool(args.get("delete_files", False))
    params = {**_vm_params(vm, args), "disk_key": disk.key, "disk_label": row["label"],
              "disk_file": row["file"], "delete_files": delete}
    what = (f"and PERMANENTLY DELETE its file {row['file']}" if delete
            else "keeping its file on the datastore")
    summary = f"Remove {row['label']} (key {disk.key}) from {_label(vm)}, {what}"
    affected = (vm_affected(vm), AffectedObject("disk", row["label"], f"{vm.moid}/{disk.key}"))
    return Plan(_on(session, summary), affected, params)


@_executor
def execute_remove_disk(call: Execution) -> dict[str, Any]:
    """Detach the disk. A safety snapshot (when policy asks) is taken only when the file is kept: deleting the
    file would fail against, or break, a snapshot that still references it."""
    p = call.params
    delete = bool(p["delete_files"])
    safety = [] if delete else _maybe_safety(call, [SafetyTarget(p["vm"], p["vm_name"])], "remove_disk")
    device = _device_by_key(call, int(p["disk_key"]))
    change = vim.vm.device.VirtualDeviceSpec(operation="remove", device=device)
    if delete:
        change.fileOperation = "destroy"
    call.task(call.vm().ReconfigVM_Task, destructive=True,
              label=f"remove {p['disk_label']} from {p['vm_name']}",
              spec=vim.vm.ConfigSpec(deviceChange=[change]))
    result = call.result(vm=p["vm_name"], moid=p["vm"], removed_disk={
        "label": p["disk_label"], "key": p["disk_key"], "file": p["disk_file"]}, files_deleted=delete,
        safety_snapshots=safety)
    if delete and call.params.get("auto_snapshot"):
        result["note"] = "no safety snapshot: the disk's file was deleted, which a snapshot could not protect"
    return result


# --------------------------------------------------------------------------------------------------
# Destructive: bulk actions over a name regex


BULK_ACTIONS = ("delete_vm", "delete_all_snapshots", "revert_to_current_snapshot")
#: the single-VM tool each bulk action runs on every VM: the caller's role must hold it too
BULK_REACH: Mapping[str, str] = {"delete_vm": "delete_vm", "delete_all_snapshots": "delete_snapshot",
              "revert_to_current_snapshot": "revert_snapshot"}


def bulk_reach(args: Args) -> tuple[str, ...]:
    """The tools a bulk call runs; an action not (yet) valid reaches every one of them (fail closed)."""
    action = BULK_REACH.get(str(args.get("action")))
    return (action,) if action is not None else tuple(sorted(set(BULK_REACH.values())))


_BULK_VM_PATHS = ("name", "parent", "resourcePool", "runtime.connectionState", "runtime.powerState",
                  "snapshot.currentSnapshot", "config.template")


@dataclass(frozen=True)
class _BulkVm:
    ref: VmRef
    current_snapshot: str | None


def compile_name_regex(pattern: str) -> UserRegex:
    """The bulk name pattern (``gateway.guard.patterns``), matched against the whole VM name:
    ``web-\\d+`` does not match ``old-web-1``."""
    return compile_user_regex("name_regex", pattern)


def _bulk_candidates(
    session: Any, regex: UserRegex, folder: FolderRef | None
) -> list[_BulkVm]:
    objects = sweep(session, [
        Query(vim.VirtualMachine, _BULK_VM_PATHS), Query(vim.ResourcePool, ("name",)),
        Query(vim.Folder, ("name", "parent")), Query(vim.Datacenter, ("name", "parent"))])
    tree = FolderTree.from_objects(objects, session.content.rootFolder._moId)
    names = {o.moid: o.props.get("name") for o in objects if o.type != "VirtualMachine"}
    found: list[_BulkVm] = []
    for o in objects:
        name = o.props.get("name", "")
        path = tree.path(o.props.get("parent"))
        if o.type != "VirtualMachine" or not regex.fullmatch(name):
            continue
        if folder is not None and not folder_matches(path, folder.path or folder.name):
            continue
        pool = o.props.get("resourcePool")
        ref = VmRef(moid=o.moid, name=name, folder=path, resource_pool=names.get(pool) if pool else None,
                    host=None, connection_state=o.props.get("runtime.connectionState"),
                    power_state=o.props.get("runtime.powerState"), folder_moid=o.props.get("parent"),
                    resource_pool_moid=o.props.get("resourcePool"),
                    template=bool(o.props.get("config.template", False)))
        found.append(_BulkVm(ref, o.props.get("snapshot.currentSnapshot")))
    return sorted(found, key=lambda b: (b.ref.name, b.ref.moid))


def _refuse_broken(session: Any, vms: Sequence[VmRef], action: str) -> None:
    broken = [vm for vm in vms if vm.connection_state in BROKEN_CONNECTION_STATES]
    if broken:
        listed = ", ".join(f"{_label(v)} is {v.connection_state}" for v in broken)
        raise errors.InvalidState(
            f"on target '{_target(session)}': {listed}; vSphere does not allow {action} on such VMs. Narrow "
            "name_regex to leave them out, and remove leftover records with unregister_vm",
            target=_target(session), vms=[v.name for v in broken])


_BULK_WORDS = {
    "delete_vm": "PERMANENTLY DELETE {n} VM(s) and their files",
    "delete_all_snapshots": "PERMANENTLY DELETE every snapshot of {n} VM(s)",
    "revert_to_current_snapshot": "Revert {n} VM(s) to their current snapshot, discarding changes made since",
}


@_state_after_policy
def plan_bulk(session: Any, args: Args) -> Plan:
    """Plan one action over every VM whose whole name matches ``name_regex`` (optionally under ``folder``).

    ``object_count`` is the number of matching VMs, so bulk limits apply before any proposal. VMs without
    snapshots are skipped (and listed) by the snapshot actions.
    """
    action = str(args["action"])
    if action not in BULK_ACTIONS:
        raise errors.InvalidArgument("action", f"must be one of {', '.join(BULK_ACTIONS)}")
    regex = compile_name_regex(str(args["name_regex"]))
    folder = (_argument("folder", resolve_folder, session, str(args["folder"]))
              if args.get("folder") is not None else None)
    matches = _bulk_candidates(session, regex, folder)
    where = f" in folder '{folder.path or folder.name}'" if folder is not None else ""
    if not matches:
        raise errors.InvalidArgument("name_regex", f"matches no VM on target '{_target(session)}'{where} "
                                     "(the pattern must match the whole name)")
    _note_resolved(*(m.ref for m in matches))
    _refuse_broken(session, [m.ref for m in matches], action.replace("_", " "))
    force = bool(args.get("force_power_off", False))
    unmet = _powered_on(session, [m.ref for m in matches]) if action == "delete_vm" and not force else ()
    chosen = [m for m in matches if action == "delete_vm" or m.current_snapshot is not None]
    skipped = [m.ref.name for m in matches if m not in chosen]
    if not chosen:
        raise errors.InvalidState(f"none of the {len(matches)} matching VM(s) has a snapshot; nothing to do",
                                  target=_target(session), vms=skipped)
    params = {"action": action, "force_power_off": force, "skipped": skipped,
              "timeout_seconds": float(args.get("timeout_seconds") or DEFAULT_TIMEOUT_SECONDS),
              "vms": [{"moid": m.ref.moid, "name": m.ref.name, "snapshot": m.current_snapshot}
                      for m in chosen]}
    # the pattern itself is not quoted (a secret can hide in it); the VMs it matched are listed
    summary = (f"{_BULK_WORDS[action].format(n=len(chosen))} whose whole name matches the given "
               f"name_regex{where}: {_names_text([m.ref.name for m in chosen])}")
    if skipped:
        summary += f" (skipping {len(skipped)} without snapshots: {_names_text(skipped)})"
    return Plan(_on(session, summary), tuple(vm_affected(m.ref) for m in chosen), params,
                object_count=len(matches), unmet=unmet)


def _bulk_one(call: Execution, action: str, vm: Mapping[str, Any], progress: ProgressFn) -> dict[str, Any]:
    moid, name = str(vm["moid"]), str(vm["name"])
    if action == "delete_vm":
        return _destroy(call, moid, name, bool(call.params["force_power_off"]), progress)
    if action == "delete_all_snapshots":
        call.task(call.vm(moid).RemoveAllSnapshots_Task, destructive=True,
                  label=f"delete snapshots of {name}", progress=progress, consolidate=True)
        return {"vm": name, "moid": moid, "snapshots_deleted": True}
    snapshot = call.obj(vim.vm.Snapshot, str(vm["snapshot"]))
    call.task(snapshot.RevertToSnapshot_Task, destructive=True, label=f"revert {name}", progress=progress)
    return {"vm": name, "moid": moid, "reverted_to": vm["snapshot"]}


@_executor
def execute_bulk(call: Execution) -> dict[str, Any]:
    """Take every safety snapshot first (revert only, when asked); then act on each VM in turn, stopping at
    the first failure, which is reported with what was done and what was not attempted."""
    p = call.params
    action, vms = str(p["action"]), list(p["vms"])
    safety = (_maybe_safety(call, [SafetyTarget(v["moid"], v["name"]) for v in vms], "bulk_vm_action")
              if action == "revert_to_current_snapshot" else [])
    done: list[dict[str, Any]] = []
    offset, steps = (len(vms), 2 * len(vms)) if safety else (0, len(vms))
    for index, vm in enumerate(vms):
        try:
            done.append(_bulk_one(call, action, vm, call.share(offset + index, steps)))
        except errors.GatewayError as exc:
            raise _bulk_stopped(call, exc, vm, done, vms[index + 1:], safety) from exc
    return call.result(action=action, count=len(done), results=done, skipped=p.get("skipped", []),
                       safety_snapshots=safety)


def _bulk_stopped(
    call: Execution, exc: errors.GatewayError, vm: Mapping[str, Any], done: list[dict[str, Any]],
    rest: list[Any], safety: list[dict[str, Any]],
) -> errors.GatewayError:
    details = {"target": call.target, "failed_vm": vm["name"], "failed_moid": vm["moid"], "cause": exc.code,
               "completed": done, "not_attempted": [v["name"] for v in rest], "safety_snapshots": safety}
    summary = (f"{len(done)} VM(s) done ({_names_text([d['vm'] for d in done]) or 'none'}), "
               f"{len(rest)} not attempted")
    if isinstance(exc, errors.OutcomeUnknown):
        return errors.OutcomeUnknown(f"{exc.message}. Bulk action stopped at VM '{vm['name']}': {summary}",
                                     **{**exc.details, **details})
    return errors.TaskFailed(
        f"bulk action stopped at VM '{vm['name']}' ({vm['moid']}): {exc.message}. {summary}", **details)
