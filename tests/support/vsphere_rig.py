"""The rig of the vSphere action tests: a fresh simulator, a session pool on it, and a separate pyVmomi
session to read the effects back (``start_rig``; the ``rig`` fixture in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from pyVim import connect

from gateway.config import Credentials, Target
from gateway.guard.decision import Verdict
from gateway.tools.spec import ToolSpec
from gateway.vocabulary import Plan
from gateway.vsphere import details
from gateway.vsphere.pool import SessionPool, VSphereSession
from support.simulator import Simulator, find_vm, pyvmomi_connect, read_properties, wait_until

MakeSimulator = Callable[..., Simulator]
Progress = list[tuple[float, str]]


@dataclass
class Rig:
    """A fresh simulator, a session pool on it, and a separate pyVmomi session to read effects back."""

    sim: Simulator
    pool: SessionPool
    si: Any
    progress: Progress = field(default_factory=list)

    def run(self, fn: Callable[[VSphereSession], Any]) -> Any:
        return self.pool.run(fn)

    def vm(self, name: str) -> Any:
        return find_vm(self.si, name)

    def props(self, obj: Any, *paths: str) -> dict[str, Any]:
        return read_properties(self.si, obj, *paths)

    def moid(self, name: str) -> str:
        return str(self.vm(name)._moId)

    def vm_names(self) -> set[str]:
        return set(self.sim.vm_names())

    def last_task(self) -> str | None:
        recent = self.props(self.si.content.taskManager, "recentTask").get("recentTask") or []
        return str(recent[-1]._moId) if recent else None

    def plan(self, spec: ToolSpec, **args: Any) -> Plan:
        valid = spec.validate({"target": "sim", **args})
        assert spec.plan is not None
        plan_fn = spec.plan
        return self.run(lambda s: plan_fn(s, valid))  # type: ignore[no-any-return]

    def plan_checked(self, spec: ToolSpec, **args: Any) -> Plan:
        """Plan, then raise the first precondition the plan records (``Plan.unmet``: a state, or an
        argument naming nothing the VM has) as the error the pipeline answers once the call is
        authorized (``InvalidState``, ``InvalidArgument``, ``Ambiguous``)."""
        plan = self.plan(spec, **args)
        if plan.unmet:
            first = plan.unmet[0]
            Verdict(False, first.message, "state", first.code, details=dict(first.details)).raise_if_refused()
        return plan

    def execute(self, spec: ToolSpec, plan: Plan, *, auto_snapshot: bool = False) -> dict[str, Any]:
        """Execute like the pipeline does: ``auto_snapshot`` set from policy on tools that declare it."""
        assert spec.execute is not None
        execute_fn = spec.execute
        plan = replace(plan, params={**plan.params, "auto_snapshot": auto_snapshot and spec.snapshot_before})
        return self.run(lambda s: execute_fn(s, plan, self.record))  # type: ignore[no-any-return]

    def call(self, spec: ToolSpec, *, auto_snapshot: bool = False, **args: Any) -> dict[str, Any]:
        return self.execute(spec, self.plan(spec, **args), auto_snapshot=auto_snapshot)

    def record(self, fraction: float, message: str) -> None:
        self.progress.append((fraction, message))

    def snapshots(self, name: str) -> tuple[list[dict[str, Any]], str | None]:
        """(flattened snapshot rows, current snapshot moid) read through the PropertyCollector."""
        info = self.props(self.vm(name), "snapshot").get("snapshot")
        if info is None:
            return [], None
        current = info.currentSnapshot._moId if info.currentSnapshot is not None else None
        return details.flatten_snapshots(info.rootSnapshotList, current), current

    def snapshot_names(self, name: str) -> list[str]:
        return [row["name"] for row in self.snapshots(name)[0]]

    def take_snapshot(self, vm_name: str, snap: str) -> str:
        """A snapshot taken directly with pyVmomi (bypassing the gateway's rules, e.g. duplicate names)."""
        vm = self.vm(vm_name)
        vm.CreateSnapshot_Task(name=snap, description="", memory=False, quiesce=False)
        return str(wait_until(lambda: self._snapshot_moid(vm_name, snap), what=f"snapshot {snap}"))

    def _snapshot_moid(self, vm_name: str, snap: str) -> str | None:
        rows = [r for r in self.snapshots(vm_name)[0] if r["name"] == snap]
        return str(rows[-1]["moid"]) if rows else None

    def power(self, name: str) -> str:
        return str(self.props(self.vm(name), "runtime.powerState")["runtime.powerState"])


def start_rig(make_simulator: MakeSimulator, *, timeout_seconds: float = 30, **options: Any) -> Iterator[Rig]:
    """By default a cluster of two hosts (VMs DC0_C0_RP0_VM0..1), a standalone host DC0_H0 (VMs
    DC0_H0_VM0..1) and datastores LocalDS_0..1, with a pool and a pyVmomi session; all closed afterwards.
    ``timeout_seconds`` is the target's socket timeout."""
    sim = make_simulator(**{"standalone_hosts": 1, "datastores": 2, **options})
    target = Target(name="sim", host=sim.host, port=sim.port, credential_env_prefix="SIM", insecure=True,
                    timeout_seconds=timeout_seconds)
    pool = SessionPool(target, Credentials(sim.user, sim.password))
    si = pyvmomi_connect(sim)
    try:
        yield Rig(sim, pool, si)
    finally:
        pool.close()
        disconnect: Any = connect.Disconnect  # untyped
        disconnect(si)
