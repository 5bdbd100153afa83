"""gateway.vsphere.actions.power: the power operations' table (task, starting states, remedy)."""

from __future__ import annotations

import pytest
from pyVmomi import vim

from gateway.vsphere.actions.power import DEFAULT_GUEST_TIMEOUT_SECONDS, POWER_OPS


@pytest.mark.parametrize(("name", "verb", "method", "allowed"), [
    ("power_on", "power on", "PowerOnVM_Task", {"poweredOff", "suspended"}),
    ("power_off", "power off", "PowerOffVM_Task", {"poweredOn", "suspended"}),
    ("suspend", "suspend", "SuspendVM_Task", {"poweredOn"}),
    ("reset", "reset", "ResetVM_Task", {"poweredOn"}),
])
def test_each_operation(name: str, verb: str, method: str, allowed: set[str]) -> None:
    op = POWER_OPS[name]
    assert (op.verb, op.method, op.allowed) == (verb, method, allowed)
    assert hasattr(vim.VirtualMachine, op.method)


@pytest.mark.parametrize("name", sorted(POWER_OPS))
def test_no_operation_starts_from_the_state_it_leads_to(name: str) -> None:
    ends = {"power_on": "poweredOn", "power_off": "poweredOff", "suspend": "suspended"}
    if name in ends:
        assert ends[name] not in POWER_OPS[name].allowed
    assert POWER_OPS[name].remedy


def test_the_operations_are_the_four_power_tools() -> None:
    assert set(POWER_OPS) == {"power_on", "power_off", "suspend", "reset"}


def test_the_guest_gets_two_minutes_to_shut_down_by_default() -> None:
    assert DEFAULT_GUEST_TIMEOUT_SECONDS == 120.0
