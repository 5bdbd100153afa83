"""The launcher (deploy/vcsim) reports updates the way vCenter does, pinned with raw pyVmomi over SOAP/TLS.

- Each session's PropertyCollector has its own update queue: a session waiting in ``WaitForUpdatesEx``
  never silences another's (govmomi's simulator keys its listeners by the collector's reference, which
  every session's default collector shares; the launcher's build overlay keys them per collector).
- ``/terminate-sessions`` drops the ended sessions' listeners; a new login's collector works.
- ``MoveIntoFolder`` is a ``modify`` of the object's ``parent`` (it stays in a recursive view), not an
  ``enter`` followed by a ``leave`` that drops it.
- ``ReconfigVM_Task`` reports what it changed (``config.hardware.memoryMB``, ``numCPU`` ...); a new VM's
  own configuration while it is built is not a reconfiguration and is not reported after its enter.

Changes are made by a third session; watchers read them with long waits on the default collector.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pytest
from pyVim.connect import Disconnect
from pyVmomi import vim, vmodl
from support.simulator import (
    MakeSimulator,
    Simulator,
    credentials_env,
    find_vm,
    pyvmomi_connect,
    read_properties,
    sim_target,
    wait_until,
)

from gateway.tools.read import MIRROR_READS
from gateway.vsphere.mirror import Mirrors

PC: Any = vmodl.query.PropertyCollector
CONFIG_SPEC: Any = vim.vm.ConfigSpec
DISCONNECT: Any = Disconnect  # untyped
VM_PATHS = ["name", "parent", "runtime.powerState", "config.hardware.memoryMB", "config.hardware.numCPU"]
DEADLINE = 10.0
"""Seconds a watcher waits for a change the launcher reports at once (its wait loop ticks every 250 ms)."""


@dataclass(frozen=True)
class ObjectUpdate:
    kind: str
    moid: str
    changes: dict[str, Any]


@dataclass
class Watcher:
    """One pyVmomi session with a filter over a recursive view of the root (VMs and folders), on the
    session's default collector (the one every session shares the reference of), applying every update
    in order the way an inventory mirror does."""

    si: Any
    version: str = ""
    updates: list[ObjectUpdate] = field(default_factory=list)
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)

    def start(self) -> Watcher:
        content = self.si.content
        kinds = [vim.VirtualMachine, vim.Folder]
        view = content.viewManager.CreateContainerView(content.rootFolder, kinds, True)
        traversal = PC.TraversalSpec(name="view", type=vim.view.ContainerView, path="view", skip=False)
        spec = PC.FilterSpec(
            objectSet=[PC.ObjectSpec(obj=view, skip=True, selectSet=[traversal])],
            propSet=[PC.PropertySpec(type=vim.VirtualMachine, pathSet=VM_PATHS),
                     PC.PropertySpec(type=vim.Folder, pathSet=["name", "parent"])])
        content.propertyCollector.CreateFilter(spec, partialUpdates=False)
        self._wait(None)
        assert self.objects, "the first wait reports the inventory"
        self.updates.clear()
        return self

    def _wait(self, max_wait: int | None) -> None:
        update = self.si.content.propertyCollector.WaitForUpdatesEx(
            self.version, PC.WaitOptions(maxWaitSeconds=max_wait))
        if update is None:
            return
        self.version = update.version
        for filter_update in update.filterSet or []:
            for change in filter_update.objectSet or []:
                got = ObjectUpdate(str(change.kind), change.obj._moId,
                                   {str(c.name): c.val for c in change.changeSet or []})
                self.updates.append(got)
                if got.kind == "leave":
                    self.objects.pop(got.moid, None)
                    continue
                if got.kind == "enter":
                    self.objects[got.moid] = {}
                self.objects.setdefault(got.moid, {}).update(got.changes)

    def until(self, condition: Callable[[Watcher], bool], what: str, timeout: float = DEADLINE) -> None:
        """Wait (long waits of one second) until ``condition(self)`` holds; ``TimeoutError`` otherwise."""
        deadline = time.monotonic() + timeout
        while not condition(self):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{what} not reported within {timeout}s; updates seen: {self.updates}")
            self._wait(1)

    def prop(self, vm: Any, path: str) -> Any:
        return self.objects.get(vm._moId, {}).get(path)

    def kinds(self, vm: Any) -> list[str]:
        return [u.kind for u in self.updates if u.moid == vm._moId]


@pytest.fixture
def sim(make_simulator: MakeSimulator) -> Simulator:
    return make_simulator(clusters=0, standalone_hosts=1, vms=3, datastores=1)


@pytest.fixture
def sessions(sim: Simulator) -> Iterator[Callable[[], Any]]:
    """Factory of pyVmomi sessions, all logged out at the end (ones the test ended are skipped)."""
    opened: list[Any] = []

    def connect() -> Any:
        opened.append(pyvmomi_connect(sim))
        return opened[-1]

    yield connect
    for si in opened:
        with contextlib.suppress(vim.fault.NotAuthenticated):  # a session the test ended
            DISCONNECT(si)


def finished(si: Any, task: Any) -> None:
    """Poll ``task`` with RetrievePropertiesEx (no WaitForUpdatesEx of this session's own)."""
    def state() -> Any:
        return read_properties(si, task, "info.state").get("info.state")

    wait_until(lambda: state() in ("success", "error"), what="task finished")
    assert read_properties(si, task, "info.state")["info.state"] == "success"


def listeners(sim: Simulator) -> int | None:
    """How many collectors receive the simulator's updates (``/inflight``; None where not reported)."""
    count = sim.control("/inflight").get("update_listeners")
    return None if count is None else int(count)


def test_two_sessions_both_receive_a_direct_power_off_and_rename(sessions: Callable[[], Any]) -> None:
    first, second = Watcher(sessions()).start(), Watcher(sessions()).start()
    actor = sessions()
    off, renamed = find_vm(actor, "DC0_H0_VM0"), find_vm(actor, "DC0_H0_VM1")

    finished(actor, off.PowerOffVM_Task())
    finished(actor, renamed.Rename_Task(newName="renamed-vm"))

    for watcher in (first, second):
        watcher.until(lambda w: w.prop(off, "runtime.powerState") == "poweredOff"
                      and w.prop(renamed, "name") == "renamed-vm", "the power-off and the rename")
        assert watcher.kinds(off) == ["modify"] and watcher.kinds(renamed) == ["modify"]


def test_a_session_after_terminate_sessions_receives_updates(
    sim: Simulator, sessions: Callable[[], Any]
) -> None:
    old = Watcher(sessions()).start()
    counts = [listeners(sim)]
    assert sim.control("/terminate-sessions", {})["terminated"] >= 1
    with pytest.raises(vim.fault.NotAuthenticated):
        old.si.content.propertyCollector.WaitForUpdatesEx(old.version, PC.WaitOptions(maxWaitSeconds=0))
    counts.append(listeners(sim))

    fresh = Watcher(sessions()).start()
    # Another new session waiting on its own collector (a task waiter, say) must not take fresh's updates.
    other = Watcher(sessions()).start()
    counts.append(listeners(sim))
    actor = sessions()
    vm = find_vm(actor, "DC0_H0_VM2")
    finished(actor, vm.Rename_Task(newName="after-terminate"))
    finished(actor, vm.PowerOffVM_Task())

    for watcher in (fresh, other):
        watcher.until(lambda w: w.prop(vm, "name") == "after-terminate"
                      and w.prop(vm, "runtime.powerState") == "poweredOff", "the rename and the power-off")
    assert counts == [1, 0, 2], "an ended session's collector stops collecting; each live one collects"


def test_a_destroyed_collector_and_a_logged_out_session_stop_listening(
    sim: Simulator, sessions: Callable[[], Any]
) -> None:
    """The way the gateway waits for tasks: a private collector per wait, destroyed after it."""
    watcher = Watcher(sessions()).start()
    vm = find_vm(watcher.si, "DC0_H0_VM0")
    private = watcher.si.content.propertyCollector.CreatePropertyCollector()
    private.CreateFilter(PC.FilterSpec(
        objectSet=[PC.ObjectSpec(obj=vm, skip=False)],
        propSet=[PC.PropertySpec(type=vim.VirtualMachine, pathSet=["name"])]), partialUpdates=False)
    private.WaitForUpdatesEx("", PC.WaitOptions(maxWaitSeconds=0))
    counts = [listeners(sim)]
    private.DestroyPropertyCollector()
    counts.append(listeners(sim))
    DISCONNECT(watcher.si)
    counts.append(listeners(sim))
    assert counts == [2, 1, 0]


def test_a_moved_vm_is_kept_by_a_client_applying_updates_in_order(sessions: Callable[[], Any]) -> None:
    watcher = Watcher(sessions()).start()
    actor = sessions()
    vm = find_vm(actor, "DC0_H0_VM0")
    datacenter = actor.content.rootFolder.childEntity[0]
    old_folder = datacenter.vmFolder
    target = old_folder.CreateFolder("moved-here")
    watcher.until(lambda w: w.prop(target, "name") == "moved-here", "the new folder")
    view_old = actor.content.viewManager.CreateContainerView(old_folder, [vim.VirtualMachine], False)
    view_new = actor.content.viewManager.CreateContainerView(target, [vim.VirtualMachine], False)
    watcher.updates.clear()

    finished(actor, target.MoveIntoFolder_Task([vm]))

    watcher.until(lambda w: bool(w.kinds(vm)), "the move")
    watcher.until(lambda w: w.prop(vm, "parent") == target, "the VM's new parent")
    assert vm._moId in watcher.objects, f"the moved VM was dropped: {watcher.updates}"
    assert watcher.kinds(vm) == ["modify"], "vCenter reports a move as a modify of the VM's parent"
    assert watcher.objects[vm._moId]["name"] == "DC0_H0_VM0"
    assert read_properties(actor, vm, "parent")["parent"] == target
    assert vm in read_properties(actor, target, "childEntity")["childEntity"]
    assert vm not in read_properties(actor, old_folder, "childEntity")["childEntity"]
    assert vm in view_new.view and vm not in view_old.view


def test_a_reconfigured_vm_reports_its_new_memory_and_cpus(sessions: Callable[[], Any]) -> None:
    watcher = Watcher(sessions()).start()
    actor = sessions()
    vm = find_vm(actor, "DC0_H0_VM1")
    before = read_properties(actor, vm, "config.hardware.memoryMB", "config.hardware.numCPU")
    assert before != {"config.hardware.memoryMB": 3072, "config.hardware.numCPU": 3}

    finished(actor, vm.ReconfigVM_Task(CONFIG_SPEC(memoryMB=3072, numCPUs=3)))

    watcher.until(lambda w: w.prop(vm, "config.hardware.memoryMB") == 3072
                  and w.prop(vm, "config.hardware.numCPU") == 3, "the new memory and CPU count")
    assert watcher.kinds(vm) and set(watcher.kinds(vm)) == {"modify"}
    assert read_properties(actor, vm, "config.hardware.memoryMB", "config.hardware.numCPU") == {
        "config.hardware.memoryMB": 3072, "config.hardware.numCPU": 3}


def test_a_cloned_vm_is_reported_with_its_sources_memory_never_the_defaults(
    sessions: Callable[[], Any],
) -> None:
    """A new VM is one enter with its state; the defaults it is built from (memoryMB 32) are never
    reported after it as a modify, which would leave a client applying updates in order with them."""
    watcher = Watcher(sessions()).start()
    actor = sessions()
    source = find_vm(actor, "DC0_H0_VM2")
    finished(actor, source.ReconfigVM_Task(CONFIG_SPEC(memoryMB=96)))
    spec = vim.vm.CloneSpec(location=vim.vm.RelocateSpec(), powerOn=False, template=False)
    clone_task = source.CloneVM_Task(folder=read_properties(actor, source, "parent")["parent"],
                                     name="clone-of-vm2", spec=spec)
    finished(actor, clone_task)
    clone = read_properties(actor, clone_task, "info.result")["info.result"]
    # a change after the clone: once the watcher has it, it has everything the clone queued before it
    finished(actor, source.Rename_Task("renamed-after-the-clone"))
    watcher.until(lambda w: w.prop(source, "name") == "renamed-after-the-clone", "the rename after the clone")

    assert watcher.prop(clone, "config.hardware.memoryMB") == 96, watcher.updates
    reported = [u.changes["config.hardware.memoryMB"] for u in watcher.updates
                if u.moid == clone._moId and "config.hardware.memoryMB" in u.changes]
    assert reported == [96], f"the clone's memory as reported, in order: {reported}"
    assert read_properties(actor, clone, "config.hardware.memoryMB")["config.hardware.memoryMB"] == 96


def synced(mirrors: Mirrors) -> bool:
    stats = mirrors.stats().get("vc1")
    return stats is not None and stats.state == "synced"


def test_two_gateway_mirrors_on_one_simulator_both_see_a_direct_power_off(
    sim: Simulator, sessions: Callable[[], Any]
) -> None:
    """Two gateways (two ``Mirrors``, each with its own sessions) on one vCenter: the second one's
    updates must not silence the first one's."""
    target = sim_target("vc1", sim, mirror="eager")
    gateways = [Mirrors([target], credentials_env({"vc1": sim}), MIRROR_READS) for _ in "ab"]
    try:
        for mirrors in gateways:
            mirrors.start_eager()
            wait_until(partial(synced, mirrors), timeout=30, what="mirror synced")
        actor = sessions()
        finished(actor, find_vm(actor, "DC0_H0_VM0").PowerOffVM_Task())

        for mirrors in gateways:
            served = mirrors.stats()["vc1"].served
            got = asyncio.run(mirrors.answer("vc1", "list_vms", {"target": "vc1"}))
            assert got is not None and mirrors.stats()["vc1"].served == served + 1, "the mirror answered"
            power = {row["name"]: row["power_state"] for row in got.value["vms"]}
            assert power["DC0_H0_VM0"] == "poweredOff", f"a mirror missed the power-off: {power}"
    finally:
        for mirrors in gateways:
            mirrors.close()
