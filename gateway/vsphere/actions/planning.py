"""What every plan function shares: resolving and describing objects, and ``_state_after_policy``."""

from __future__ import annotations

import contextvars
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import pyVmomi

from gateway import errors
from gateway.vocabulary import AffectedObject, Plan, Precondition
from gateway.vsphere.collector import managed_object, object_spec, retrieve_objects
from gateway.vsphere.resolve import DatastoreRef, VmRef, resolve_datastore, resolve_vm, vm_facts

T = TypeVar("T")
vim: Any = pyVmomi.vim  # pyVmomi's constructors are untyped
Args = Mapping[str, Any]
DEFAULT_TIMEOUT_SECONDS = 600.0
BROKEN_CONNECTION_STATES = frozenset({"orphaned", "inaccessible", "invalid"})
MAX_NAME_CHARS = 80
_SUMMARY_NAMES = 10


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
# The host a VM runs on: what reconfigure, ISO mounts, migration and clones check against


_HOST_PATHS = ("name", "summary.hardware.numCpuThreads", "summary.hardware.memorySize", "network",
               "datastore")


def _host_facts(session: Any, host_moid: str | None) -> dict[str, Any]:
    if host_moid is None:
        return {}
    p = _read(session, vim.HostSystem, host_moid, _HOST_PATHS)
    return {"name": p.get("name", host_moid), "threads": p.get("summary.hardware.numCpuThreads"),
            "memory_mb": (p.get("summary.hardware.memorySize") or 0) // (1024 * 1024) or None,
            "networks": set(_moids(p.get("network"))), "datastores": set(_moids(p.get("datastore")))}


def _datastore_on_host(session: Any, field: str, ref: str, host: Mapping[str, Any]) -> DatastoreRef:
    ds = _argument(field, resolve_datastore, session, ref)
    if ds.accessible is False:
        raise errors.InvalidArgument(field, f"datastore '{ds.name}' is not accessible")
    if host and ds.moid not in host["datastores"]:
        raise errors.InvalidArgument(field, f"datastore '{ds.name}' is not mounted on host '{host['name']}'")
    return ds
