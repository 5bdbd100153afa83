"""The shared call vocabulary: categories, kinds, risk ranks, affected objects, plans."""

from __future__ import annotations

import pytest

from gateway.vocabulary import AffectedObject, Category, Kind, Plan, Precondition, Risk


@pytest.mark.parametrize(("member", "text"), [(Category.READ, "read"), (Category.WRITE, "write"),
                                              (Category.DESTRUCTIVE, "destructive")])
def test_category_values_are_their_wire_text(member: Category, text: str) -> None:
    assert member == text
    assert Category(text) is member


@pytest.mark.parametrize(("member", "text"), [(Kind.PERSON, "person"), (Kind.AGENT, "agent")])
def test_kind_values_are_their_wire_text(member: Kind, text: str) -> None:
    assert str(member) == text
    assert Kind(text) is member


@pytest.mark.parametrize(("risk", "rank"), [(Risk.LOW, 0), (Risk.MEDIUM, 1), (Risk.HIGH, 2),
                                            (Risk.CRITICAL, 3)])
def test_risk_rank_orders_low_to_critical(risk: Risk, rank: int) -> None:
    assert risk.rank == rank


def test_risks_sort_by_rank() -> None:
    assert sorted([Risk.CRITICAL, Risk.LOW, Risk.HIGH, Risk.MEDIUM], key=lambda r: r.rank) == list(Risk)


def test_unknown_category_is_refused() -> None:
    with pytest.raises(ValueError):
        Category("delete")


def test_affected_object_to_dict_leaves_out_unset_facts() -> None:
    obj = AffectedObject(type="VirtualMachine", name="web1", moid="vm-42", folder="prod")
    assert obj.to_dict() == {"type": "VirtualMachine", "name": "web1", "moid": "vm-42", "folder": "prod"}


def test_affected_object_to_dict_keeps_every_set_fact() -> None:
    obj = AffectedObject("HostSystem", "esx1", "host-9", folder="f", resource_pool="rp",
                         connection_state="connected")
    assert obj.to_dict() == {"type": "HostSystem", "name": "esx1", "moid": "host-9", "folder": "f",
                             "resource_pool": "rp", "connection_state": "connected"}


def test_affected_object_is_frozen() -> None:
    obj = AffectedObject("VirtualMachine", "web1", "vm-1")
    with pytest.raises(AttributeError):
        obj.name = "web2"  # type: ignore[misc]


def test_precondition_defaults_to_invalid_state_with_no_details() -> None:
    unmet = Precondition("the VM is powered on")
    assert unmet.code == "invalid_state"
    assert dict(unmet.details) == {}


def test_plan_count_is_the_number_of_affected_objects_by_default() -> None:
    plan = Plan("power off 2 VMs", (AffectedObject("VirtualMachine", "a", "vm-1"),
                                    AffectedObject("VirtualMachine", "b", "vm-2")))
    assert plan.count == 2


@pytest.mark.parametrize("count", [0, 1, 500])
def test_plan_count_is_object_count_when_set(count: int) -> None:
    plan = Plan("bulk", (AffectedObject("VirtualMachine", "a", "vm-1"),), object_count=count)
    assert plan.count == count


def test_plan_defaults() -> None:
    plan = Plan("nothing", ())
    assert plan.count == 0
    assert plan.unmet == ()
    assert plan.blast_radius is None
    assert dict(plan.params) == {}
