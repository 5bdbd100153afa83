"""A zero-wait WaitForUpdatesEx is one update calculation made at once, as vSphere documents it: the
launcher's build overlay (deploy/vcsim/build.sh) patches govmomi's collector, which otherwise makes that
calculation only at its first 250 ms tick.

Driven with pyVmomi over SOAP/TLS against the real launcher; ``/inflight`` reports how many zero-wait polls
the patched collector computed at once (the ticker path never counts).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from pyVmomi import vim, vmodl
from support.simulator import MakeSimulator, Simulator, find_vm

_PC: Any = vmodl.query.PropertyCollector


@pytest.fixture
def sim(make_simulator: MakeSimulator) -> Simulator:
    return make_simulator(clusters=0, standalone_hosts=1, vms=2, datastores=1)


def _at_once(sim: Simulator) -> int:
    return int(sim.control("/inflight")["zero_waits_at_once"])


def _poll(collector: Any, version: str, wait: int | None = 0) -> Any:
    return collector.WaitForUpdatesEx(version, _PC.WaitOptions(maxWaitSeconds=wait))


def _power_states(update: Any) -> list[Any]:
    if update is None:
        return []
    return [change.val for filter_set in update.filterSet for obj in filter_set.objectSet
            for change in obj.changeSet if change.name == "runtime.powerState"]


def _power_state_collector(si: Any, vm: Any) -> Any:
    """A collector of its own with one filter on ``vm``'s power state."""
    collector = si.content.propertyCollector.CreatePropertyCollector()
    collector.CreateFilter(_PC.FilterSpec(
        objectSet=[_PC.ObjectSpec(obj=vm, skip=False)],
        propSet=[_PC.PropertySpec(type=vim.VirtualMachine, pathSet=["runtime.powerState"])]), True)
    return collector


def test_a_zero_wait_poll_is_computed_at_once_with_or_without_a_change(sim: Simulator, si: Any) -> None:
    vm = find_vm(si, "DC0_H0_VM0")
    collector = _power_state_collector(si, vm)
    first = _poll(collector, "", wait=None)
    assert _power_states(first) == ["poweredOn"]
    before = _at_once(sim)

    assert _poll(collector, first.version) is None
    assert _at_once(sim) == before + 1

    vm.PowerOffVM_Task()
    polls, changed, deadline = 1, _poll(collector, first.version), time.monotonic() + 30
    while changed is None:  # the simulator's task applies its change after the call returned; poll again
        assert time.monotonic() < deadline, "the power-off never came through a zero-wait poll"
        polls, changed = polls + 1, _poll(collector, first.version)
    assert _power_states(changed) == ["poweredOff"]
    assert _at_once(sim) == before + 1 + polls, "every zero-wait poll, after a change too, is at once"
    assert _poll(collector, changed.version) is None


def test_a_long_wait_still_waits_for_a_change(sim: Simulator, si: Any) -> None:
    """Only maxWaitSeconds=0 is patched: a wait with a limit returns with the change, not at once empty."""
    vm = find_vm(si, "DC0_H0_VM1")
    collector = _power_state_collector(si, vm)
    version = _poll(collector, "", wait=None).version
    before = _at_once(sim)
    vm.PowerOffVM_Task()
    assert _power_states(_poll(collector, version, wait=30)) == ["poweredOff"]
    assert _at_once(sim) == before


def test_each_collector_gets_the_change_once(sim: Simulator, si: Any) -> None:
    """A collector that has not yet handed out a change still gets it after another one did."""
    vm = find_vm(si, "DC0_H0_VM1")
    one, two = _power_state_collector(si, vm), _power_state_collector(si, vm)
    v1 = _poll(one, "", wait=None).version
    v2 = _poll(two, "", wait=None).version
    vm.PowerOffVM_Task()
    seen = _poll(one, v1, wait=30)
    assert _power_states(seen) == ["poweredOff"]
    assert _poll(one, seen.version) is None
    assert _power_states(_poll(two, v2)) == ["poweredOff"]
