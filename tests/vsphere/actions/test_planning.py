"""gateway.vsphere.actions.planning: names, usable VMs, argument errors, and state answered after policy."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from pyVmomi import vim

from gateway import errors
from gateway.config import Target
from gateway.vocabulary import AffectedObject, Plan
from gateway.vsphere.actions.planning import (
    BROKEN_CONNECTION_STATES,
    DEFAULT_TIMEOUT_SECONDS,
    MAX_NAME_CHARS,
    _argument,
    _check_name,
    _label,
    _moid,
    _moids,
    _names_text,
    _note_resolved,
    _on,
    _state_after_policy,
    _vm_params,
    require_usable,
    vm_affected,
    vsphere_name,
)
from gateway.vsphere.resolve import VmRef

SESSION = SimpleNamespace(target=Target("vc1", "vc1.example", "VC1"))


def vm(moid: str = "vm-1", name: str = "web-1", state: str | None = "connected") -> VmRef:
    return VmRef(moid, name, "/DC0/vm", "gold", "esx-1", state, "poweredOn")


@pytest.mark.parametrize(("name", "stored"), [
    ("web-1", "web-1"),
    ("a/b", "a%2fb"),
    ("a\\b", "a%5cb"),
    ("50%", "50%25"),
    ("a%2fb", "a%2fb"),
    ("a%2Fb", "a%2Fb"),
    ("a%5Cb", "a%5Cb"),
    ("a%25b", "a%25b"),
    ("a%20b", "a%2520b"),
    ("%", "%25"),
    ("/\\%", "%2f%5c%25"),
    ("", ""),
])
def test_vsphere_name_escapes_as_vsphere_stores_names(name: str, stored: str) -> None:
    assert vsphere_name(name) == stored


@pytest.mark.parametrize("name", ["web", "  padded  ", "x" * MAX_NAME_CHARS, "ünï cödé"])
def test_check_name_accepts_and_strips(name: str) -> None:
    assert _check_name("name", name) == name.strip()


@pytest.mark.parametrize(("name", "problem"), [
    ("", "name: must be 1 to 80 characters"),
    ("   ", "name: must be 1 to 80 characters"),
    ("x" * (MAX_NAME_CHARS + 1), "name: must be 1 to 80 characters"),
    ("tab\there", "name: must not contain control characters"),
    ("bell\x07", "name: must not contain control characters"),
])
def test_check_name_refuses(name: str, problem: str) -> None:
    with pytest.raises(errors.InvalidArgument) as raised:
        _check_name("name", name)
    assert raised.value.message == problem


@pytest.mark.parametrize("state", sorted(BROKEN_CONNECTION_STATES))
def test_a_broken_vm_is_refused_naming_the_way_out(state: str) -> None:
    with pytest.raises(errors.InvalidState) as raised:
        require_usable(SESSION, vm(state=state), "a power change")
    assert raised.value.message == (
        f"VM 'web-1' (vm-1) on target 'vc1' is {state}: vSphere does not allow a power change on such a VM "
        "and would answer only 'not allowed in the current state'. If the record is a leftover, remove it "
        "with unregister_vm (its files stay on the datastore)")
    assert raised.value.details == {"target": "vc1", "vm": "web-1", "moid": "vm-1", "connection_state": state}


@pytest.mark.parametrize("state", ["connected", "disconnected", None])
def test_other_connection_states_are_usable(state: str | None) -> None:
    require_usable(SESSION, vm(state=state), "anything")


def test_vm_affected_is_what_policy_matches_on() -> None:
    assert vm_affected(vm()) == AffectedObject("vm", "web-1", "vm-1", "/DC0/vm", "gold", "connected")


def test_labels() -> None:
    assert _label(vm()) == "VM 'web-1' (vm-1)"
    assert _on(SESSION, "Power on VM 'a'") == "Power on VM 'a' on target 'vc1'"


@pytest.mark.parametrize(("count", "text"), [
    (0, ""), (1, "v0"), (3, "v0, v1, v2"),
    (10, ", ".join(f"v{i}" for i in range(10))),
    (12, ", ".join(f"v{i}" for i in range(10)) + " and 2 more"),
])
def test_names_text_shows_ten_then_counts(count: int, text: str) -> None:
    assert _names_text([f"v{i}" for i in range(count)]) == text


def test_moids_of_references_and_strings() -> None:
    assert _moid(None) is None
    assert _moid("host-1") == "host-1"
    assert _moid(vim.HostSystem("host-2")) == "host-2"
    assert _moids([vim.Datastore("ds-1"), "ds-2", None]) == ["ds-1", "ds-2"]
    assert _moids(None) == []


def test_vm_params_hold_moids_and_the_timeout() -> None:
    assert _vm_params(vm(), {}) == {"vm": "vm-1", "vm_name": "web-1",
                                    "timeout_seconds": DEFAULT_TIMEOUT_SECONDS}
    assert _vm_params(vm(), {"timeout_seconds": 5})["timeout_seconds"] == 5.0


def test_an_argument_naming_nothing_is_a_bad_argument() -> None:
    def resolve(_session: Any, ref: str) -> str:
        raise errors.NotFound(f"no datastore named '{ref}'")

    with pytest.raises(errors.InvalidArgument) as raised:
        _argument("datastore", resolve, SESSION, "ds9")
    assert raised.value.message == "datastore: no datastore named 'ds9'"


def test_an_ambiguous_argument_names_its_field() -> None:
    def resolve(_session: Any, _ref: str) -> str:
        raise errors.Ambiguous("two", candidates=["a", "b"])

    with pytest.raises(errors.Ambiguous) as raised:
        _argument("host", resolve, SESSION, "esx")
    assert raised.value.details == {"candidates": ["a", "b"], "field": "host"}


def test_a_resolved_argument_is_returned() -> None:
    assert _argument("host", lambda _s, ref: ref.upper(), SESSION, "esx") == "ESX"


# --------------------------------------------------------------------------- state after policy


@_state_after_policy
def plan_after(vms: list[VmRef], error: errors.GatewayError | None) -> Plan:
    _note_resolved(*vms)
    if error is not None:
        raise error
    return Plan("done", tuple(vm_affected(v) for v in vms))


def test_a_plan_that_succeeds_is_returned_as_it_is() -> None:
    assert plan_after([vm()], None).summary == "done"


def test_a_wrong_state_becomes_an_unmet_precondition_on_the_resolved_vms() -> None:
    plan = plan_after([vm("vm-1", "a"), vm("vm-2", "b"), vm("vm-1", "a")],
                      errors.InvalidState("VM 'a' is powered on", vm="a"))
    assert plan.summary == "Change VM 'a' (vm-1), VM 'b' (vm-2) (not possible in their current state)"
    assert [o.moid for o in plan.affected] == ["vm-1", "vm-2"]
    assert plan.object_count == 2 and plan.params == {}
    (unmet,) = plan.unmet
    assert (unmet.message, dict(unmet.details), unmet.code) == ("VM 'a' is powered on", {"vm": "a"},
                                                                "invalid_state")


def test_a_wrong_state_before_any_vm_was_resolved() -> None:
    plan = plan_after([], errors.InvalidState("not now"))
    assert plan.summary == "Change the named objects (not possible in their current state)"
    assert plan.affected == () and plan.object_count is None


@pytest.mark.parametrize("error", [errors.InvalidArgument("disk", "no disk 'Hard disk 9'"),
                                   errors.NotFound("no snapshot 'x'"), errors.Ambiguous("two snapshots")])
def test_a_bad_argument_about_a_resolved_vm_is_answered_after_policy_with_its_code(
        error: errors.GatewayError) -> None:
    plan = plan_after([vm()], error)
    (unmet,) = plan.unmet
    assert unmet.code == error.code and unmet.message == error.message


@pytest.mark.parametrize("error", [errors.InvalidArgument("name", "must be 1 to 80 characters"),
                                   errors.NotFound("no VM named 'x'")])
def test_a_bad_argument_alone_is_raised_at_once(error: errors.GatewayError) -> None:
    with pytest.raises(type(error)):
        plan_after([], error)


def test_other_errors_are_raised() -> None:
    with pytest.raises(errors.PermissionDenied):
        plan_after([vm()], errors.PermissionDenied("no"))


def test_a_vm_noted_outside_a_plan_reaches_no_plan() -> None:
    _note_resolved(vm("vm-9", "stray"))
    assert plan_after([], errors.InvalidState("not now")).affected == ()
