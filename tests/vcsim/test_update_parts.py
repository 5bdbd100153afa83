"""The launcher bounds a ``WaitForUpdatesEx`` reply by ``WaitOptions.maxObjectUpdates`` as vCenter does
(deploy/vcsim/overlay/updates.go): at most that many object updates, ``truncated`` and a version that
continues with the rest, the initial state and any later batch alike; a client that never asks gets every
update in one reply. Driven with raw pyVmomi over SOAP/TLS; ``/inflight`` reports how many collectors hold
the rest of a truncated reply.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pyVim.connect import Disconnect
from pyVim.task import WaitForTask
from pyVmomi import vim, vmodl
from support.simulator import MakeSimulator, Simulator, pyvmomi_connect

PC: Any = vmodl.query.PropertyCollector
DISCONNECT: Any = Disconnect  # untyped
WAIT_FOR_TASK: Any = WaitForTask  # untyped


@pytest.fixture
def sim(make_simulator: MakeSimulator) -> Simulator:
    return make_simulator(clusters=0, standalone_hosts=1, vms=7, datastores=1)


@pytest.fixture
def view(si: Any) -> Iterator[Any]:
    view = si.content.viewManager.CreateContainerView(si.content.rootFolder, [vim.VirtualMachine], True)
    yield view
    view.DestroyView()


def _filter(si: Any, view: Any) -> Any:
    return si.content.propertyCollector.CreateFilter(PC.FilterSpec(
        objectSet=[PC.ObjectSpec(obj=view, skip=True, selectSet=[
            PC.TraversalSpec(name="view", type=vim.view.ContainerView, path="view", skip=False)])],
        propSet=[PC.PropertySpec(type=vim.VirtualMachine, pathSet=["name"])]), partialUpdates=False)


def _changes(update: Any) -> list[tuple[str, str, str]]:
    """(kind, moid, name) of every object update in ``update``."""
    return [(o.kind, o.obj._moId, next((c.val for c in o.changeSet or [] if c.name == "name"), ""))
            for f in update.filterSet or [] for o in f.objectSet or []]


def _parts(collector: Any, version: str, most: int, wait: int = 0) -> tuple[list[list[Any]], str]:
    """Every part of one reply asked with maxObjectUpdates=``most``: the parts' changes and the version
    after the last."""
    parts = []
    while True:
        update = collector.WaitForUpdatesEx(version, PC.WaitOptions(maxWaitSeconds=wait,
                                                                    maxObjectUpdates=most))
        assert update is not None
        parts.append(_changes(update))
        version = update.version
        if not update.truncated:
            return parts, version


def _pending(sim: Simulator) -> int:
    return int(sim.control("/inflight")["pending_update_parts"])


def test_a_client_that_never_asks_gets_the_whole_state_in_one_reply(si: Any, view: Any) -> None:
    collector = si.content.propertyCollector
    _filter(si, view)
    update = collector.WaitForUpdatesEx("", PC.WaitOptions(maxWaitSeconds=0))
    assert not update.truncated
    assert len(_changes(update)) == 7


def test_the_initial_state_comes_in_parts_of_max_object_updates_then_changes_follow(
        sim: Simulator, si: Any, view: Any) -> None:
    collector = si.content.propertyCollector
    _filter(si, view)
    first = collector.WaitForUpdatesEx("", PC.WaitOptions(maxWaitSeconds=0, maxObjectUpdates=3))
    assert first.truncated and _pending(sim) == 1
    parts, version = _parts(collector, first.version, 3)
    parts.insert(0, _changes(first))
    assert [len(p) for p in parts] == [3, 3, 1]
    moids = [moid for part in parts for kind, moid, _ in part if kind == "enter"]
    assert len(set(moids)) == 7
    assert _pending(sim) == 0

    vm = next(v for v in view.view if v._moId == moids[0])
    WAIT_FOR_TASK(vm.Rename_Task("renamed-after-parts"))
    changed, _ = _parts(collector, version, 3, wait=30)
    assert changed == [[("modify", moids[0], "renamed-after-parts")]]


def test_a_later_batch_larger_than_max_object_updates_is_truncated_too(
        sim: Simulator, si: Any, view: Any) -> None:
    collector = si.content.propertyCollector
    _filter(si, view)
    _, version = _parts(collector, "", 100)
    vms = list(view.view)[:3]
    for i, vm in enumerate(vms):
        WAIT_FOR_TASK(vm.Rename_Task(f"batch-{i}"))
    parts, _ = _parts(collector, version, 1, wait=30)
    assert all(len(p) == 1 for p in parts)
    assert sorted(c for p in parts for c in p) == sorted(
        ("modify", vm._moId, f"batch-{i}") for i, vm in enumerate(vms))


def test_the_end_of_a_session_drops_the_rest_of_its_truncated_reply(sim: Simulator) -> None:
    si = pyvmomi_connect(sim)
    view = si.content.viewManager.CreateContainerView(si.content.rootFolder, [vim.VirtualMachine], True)
    _filter(si, view)
    first = si.content.propertyCollector.WaitForUpdatesEx("", PC.WaitOptions(maxObjectUpdates=2))
    assert first.truncated and _pending(sim) == 1
    DISCONNECT(si)
    assert _pending(sim) == 0
