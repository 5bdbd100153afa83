"""The launcher answers a zero-wait WaitForUpdatesEx at once when nothing changed (deploy/vcsim/zerowait.go),
and still lets the simulator compute every update when something did.

Driven with pyVmomi over SOAP/TLS against the real launcher; ``/inflight`` reports how many zero-wait polls
were answered without the simulator's 250 ms ticker.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pyVim.connect import Disconnect
from pyVmomi import vim, vmodl
from simulator import MakeSimulator, Simulator, find_vm, pyvmomi_connect

_PC: Any = vmodl.query.PropertyCollector


@pytest.fixture
def sim(make_simulator: MakeSimulator) -> Simulator:
    return make_simulator(clusters=0, standalone_hosts=1, vms=2, datastores=1)


@pytest.fixture
def si(sim: Simulator) -> Iterator[Any]:
    service = pyvmomi_connect(sim)
    yield service
    Disconnect(service)


def _at_once(sim: Simulator) -> int:
    return int(sim.control("/inflight")["zero_waits_at_once"])


def _poll(collector: Any, version: str, wait: int | None = 0) -> Any:
    return collector.WaitForUpdatesEx(version, _PC.WaitOptions(maxWaitSeconds=wait))


def _power_states(update: Any) -> list[Any]:
    if update is None:
        return []
    return [change.val for filter_set in update.filterSet for obj in filter_set.objectSet
            for change in obj.changeSet if change.name == "runtime.powerState"]


def test_zero_wait_without_change_is_answered_at_once_and_a_change_still_comes_through(
    sim: Simulator, si: Any
) -> None:
    vm = find_vm(si, "DC0_H0_VM0")
    collector = si.content.propertyCollector.CreatePropertyCollector()
    collector.CreateFilter(_PC.FilterSpec(
        objectSet=[_PC.ObjectSpec(obj=vm, skip=False)],
        propSet=[_PC.PropertySpec(type=vim.VirtualMachine, pathSet=["runtime.powerState"])]), True)
    first = _poll(collector, "", wait=None)
    assert _power_states(first) == ["poweredOn"]
    settled = _poll(collector, first.version)  # the simulator's own answer (its tick), drains nothing new
    assert settled is None
    before = _at_once(sim)

    assert _poll(collector, first.version) is None
    assert _at_once(sim) == before + 1

    vm.PowerOffVM_Task()
    changed = _poll(collector, first.version)
    while changed is None:  # the simulator's tick may come before the task's change; poll again, no wait
        changed = _poll(collector, first.version)
    assert _power_states(changed) == ["poweredOff"]
    assert _at_once(sim) == before + 1  # a poll after a change is never answered without the simulator


def test_zero_wait_at_once_is_per_collector(sim: Simulator, si: Any) -> None:
    """A collector that has not yet handed out a change is not answered from another one's state."""
    vm = find_vm(si, "DC0_H0_VM1")
    spec = _PC.FilterSpec(objectSet=[_PC.ObjectSpec(obj=vm, skip=False)],
                          propSet=[_PC.PropertySpec(type=vim.VirtualMachine, pathSet=["runtime.powerState"])])
    one = si.content.propertyCollector.CreatePropertyCollector()
    two = si.content.propertyCollector.CreatePropertyCollector()
    one.CreateFilter(spec, True)
    two.CreateFilter(spec, True)
    v1 = _poll(one, "", wait=None).version
    v2 = _poll(two, "", wait=None).version
    vm.PowerOffVM_Task()
    seen = _poll(one, v1)
    while seen is None:
        seen = _poll(one, v1)
    assert _power_states(seen) == ["poweredOff"]
    assert _poll(one, seen.version) is None
    before = _at_once(sim)
    assert _power_states(_poll(two, v2)) == ["poweredOff"]
    assert _at_once(sim) == before
