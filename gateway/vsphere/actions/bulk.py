"""One destructive action over every VM whose whole name matches a pattern."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyVmomi

from gateway import errors
from gateway.guard.patterns import UserRegex, compile_user_regex
from gateway.vocabulary import Plan, ProgressFn
from gateway.vsphere.actions.blast import many_vms
from gateway.vsphere.actions.execution import Execution, _executor
from gateway.vsphere.actions.planning import (
    BROKEN_CONNECTION_STATES,
    DEFAULT_TIMEOUT_SECONDS,
    Args,
    _argument,
    _label,
    _names_text,
    _note_resolved,
    _on,
    _state_after_policy,
    _target,
    vm_affected,
)
from gateway.vsphere.actions.removal import _destroy, _powered_on
from gateway.vsphere.actions.safety import SafetyTarget, _maybe_safety
from gateway.vsphere.collector import Query, sweep
from gateway.vsphere.resolve import FolderRef, FolderTree, VmRef, folder_matches, resolve_folder

vim: Any = pyVmomi.vim  # pyVmomi's constructors are untyped

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
                object_count=len(matches), unmet=unmet, blast_radius=many_vms([m.ref for m in chosen]))


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
