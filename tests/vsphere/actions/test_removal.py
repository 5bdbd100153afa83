"""gateway.vsphere.actions.removal: a delete's precondition that every VM is powered off."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from gateway.config import Target
from gateway.vsphere.actions.removal import _powered_on
from gateway.vsphere.resolve import VmRef

SESSION = SimpleNamespace(target=Target("vc1", "vc1.example", "VC1"))
OFF = VmRef("vm-1", "a", "/DC0/vm", None, "esx-1", "connected", "poweredOff")


def test_powered_off_vms_meet_it() -> None:
    assert _powered_on(SESSION, [OFF, replace(OFF, moid="vm-2", power_state="suspended")]) == ()
    assert _powered_on(SESSION, []) == ()


def test_one_powered_on_vm() -> None:
    (unmet,) = _powered_on(SESSION, [OFF, replace(OFF, moid="vm-2", name="b", power_state="poweredOn")])
    assert unmet.message == ("VM 'b' (vm-2) on target 'vc1' is powered on; power it off first (power_off_vm) "
                             "or pass force_power_off=true to power it off as part of the delete")
    assert dict(unmet.details) == {"target": "vc1", "vms": ["b"]}
    assert unmet.code == "invalid_state"


def test_several_powered_on_vms_are_named_together() -> None:
    on = [replace(OFF, moid=f"vm-{i}", name=f"v{i}", power_state="poweredOn") for i in range(3)]
    (unmet,) = _powered_on(SESSION, on)
    assert unmet.message.startswith("VM 'v0' (vm-0), VM 'v1' (vm-1), VM 'v2' (vm-2) on target 'vc1' are "
                                    "powered on; power them off first")
    assert unmet.message.endswith("to power them off as part of the delete")
    assert dict(unmet.details)["vms"] == ["v0", "v1", "v2"]


def test_more_than_ten_are_counted() -> None:
    on = [replace(OFF, moid=f"vm-{i}", name=f"v{i}", power_state="poweredOn") for i in range(12)]
    (unmet,) = _powered_on(SESSION, on)
    assert " and 2 more on target 'vc1' are powered on" in unmet.message
    assert len(dict(unmet.details)["vms"]) == 12
