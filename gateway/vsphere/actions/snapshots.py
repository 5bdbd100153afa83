"""Snapshots of one VM: take one, delete one (and its children), revert to one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyVmomi

from gateway import errors
from gateway.vocabulary import AffectedObject, Plan
from gateway.vsphere.actions.execution import Execution, _executor, _power_state
from gateway.vsphere.actions.planning import (
    Args,
    _check_name,
    _label,
    _moid,
    _on,
    _resolve_vm,
    _state_after_policy,
    _vm_params,
    vm_affected,
)
from gateway.vsphere.actions.safety import SafetyTarget, _maybe_safety
from gateway.vsphere.details import flatten_snapshots, read_snapshot_info
from gateway.vsphere.resolve import VmRef

vim: Any = pyVmomi.vim  # pyVmomi's constructors are untyped


# --------------------------------------------------------------------------------------------------
# Taking a snapshot


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
