"""Safety snapshots of every affected VM before a revert-type step, when policy asks: all or nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway import errors
from gateway.vsphere.actions.execution import Execution
from gateway.vsphere.actions.planning import _moid

SAFETY_PREFIX = "gateway-safety-"


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
