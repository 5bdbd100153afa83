"""What a role may do: ``Role.permits_tool``, ``permits_target``, ``describe`` and the pure ``permits``."""

from __future__ import annotations

import pytest

from gateway.role import ALL_TARGETS, BUILTIN_ROLES, Role, permits
from gateway.vocabulary import Category

READ, WRITE, DESTRUCTIVE = Category.READ, Category.WRITE, Category.DESTRUCTIVE

OPERATOR = Role("operator", tools="read", allow_write=frozenset({"power_on_vm"}),
                allow_destructive=frozenset({"delete_vm"}), targets=("lab-*", "vc1"))
LISTED = Role("listed", tools=frozenset({"list_vms", "power_off_vm"}), targets="*")


@pytest.mark.parametrize(("role", "tool", "category", "allowed"), [
    (BUILTIN_ROLES["reader"], "list_vms", READ, True),
    (BUILTIN_ROLES["reader"], "power_on_vm", WRITE, False),
    (BUILTIN_ROLES["reader"], "delete_vm", DESTRUCTIVE, False),
    (BUILTIN_ROLES["admin"], "list_vms", READ, True),
    (BUILTIN_ROLES["admin"], "power_on_vm", WRITE, True),
    (BUILTIN_ROLES["admin"], "delete_vm", DESTRUCTIVE, True),
    (OPERATOR, "list_vms", READ, True),
    (OPERATOR, "power_on_vm", WRITE, True),
    (OPERATOR, "power_off_vm", WRITE, False),
    (OPERATOR, "delete_vm", DESTRUCTIVE, True),
    (OPERATOR, "delete_snapshot", DESTRUCTIVE, False),
    # a write grant does not cover the same name in another category
    (OPERATOR, "power_on_vm", DESTRUCTIVE, False),
    (OPERATOR, "delete_vm", WRITE, False),
    (LISTED, "list_vms", READ, True),
    (LISTED, "power_off_vm", WRITE, True),
    (LISTED, "list_hosts", READ, False),
    (LISTED, "delete_vm", DESTRUCTIVE, False),
])
def test_permits_tool(role: Role, tool: str, category: Category, allowed: bool) -> None:
    assert role.permits_tool(tool, category) is allowed


@pytest.mark.parametrize(("role", "target", "allowed"), [
    (BUILTIN_ROLES["admin"], "vc1", True),
    (BUILTIN_ROLES["admin"], "all", True),
    (BUILTIN_ROLES["admin"], "*", True),
    (OPERATOR, "vc1", True),
    (OPERATOR, "lab-east", True),
    (OPERATOR, "lab-", True),
    (OPERATOR, "prod-vc", False),
    (OPERATOR, "VC1", False),  # globs match case-sensitively
    (OPERATOR, "all", False),  # every target needs targets: "*"
    (OPERATOR, "*", False),
])
def test_permits_target(role: Role, target: str, allowed: bool) -> None:
    assert role.permits_target(target) is allowed


def test_all_targets_names() -> None:
    assert frozenset({"all", "*"}) == ALL_TARGETS


@pytest.mark.parametrize(("tool", "category", "target", "allowed"), [
    ("list_vms", READ, None, True),
    ("list_vms", READ, "vc1", True),
    ("list_vms", READ, "prod", False),
    ("power_on_vm", WRITE, "lab-1", True),
    ("power_off_vm", WRITE, "lab-1", False),
    ("delete_vm", DESTRUCTIVE, "all", False),
])
def test_permits_needs_both_tool_and_target(tool: str, category: Category, target: str | None,
                                            allowed: bool) -> None:
    assert permits(OPERATOR, tool, category, target) is allowed


def test_builtin_roles() -> None:
    reader, admin = BUILTIN_ROLES["reader"], BUILTIN_ROLES["admin"]
    assert (reader.tools, reader.approve, reader.audit, reader.all_targets) == ("read", "none", "own", True)
    assert (admin.tools, admin.approve, admin.audit, admin.all_targets) == ("*", "any", "all", True)
    assert set(BUILTIN_ROLES) == {"reader", "admin"}


def test_role_defaults_are_the_narrowest() -> None:
    role = Role("r", tools="read")
    assert role.approve == "none"
    assert role.audit == "none"
    assert role.queue_weight == 1.0
    assert role.fair_share == "caller"
    assert role.allow_write == frozenset()
    assert role.allow_destructive == frozenset()


def test_describe_admin_says_every_tool() -> None:
    assert BUILTIN_ROLES["admin"].describe() == {
        "name": "admin", "tools": "*", "allow_write": "*", "allow_destructive": "*", "targets": "*",
        "approve": "any", "audit": "all", "queue_weight": 1.0, "fair_share": "caller"}


def test_describe_lists_grants_sorted_and_targets_as_given() -> None:
    described = OPERATOR.describe()
    assert described["tools"] == "read"
    assert described["allow_write"] == ["power_on_vm"]
    assert described["allow_destructive"] == ["delete_vm"]
    assert described["targets"] == ["lab-*", "vc1"]


def test_describe_counts_listed_tools_by_the_catalog() -> None:
    catalog = {"list_vms": READ, "power_off_vm": WRITE, "delete_vm": DESTRUCTIVE}
    described = LISTED.describe(catalog)
    assert described["tools"] == ["list_vms", "power_off_vm"]
    assert described["allow_write"] == ["power_off_vm"]
    assert described["allow_destructive"] == []


def test_describe_without_catalog_counts_only_allow_keys() -> None:
    assert LISTED.describe()["allow_write"] == []
