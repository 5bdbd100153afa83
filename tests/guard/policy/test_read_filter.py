"""Read rules, pure: which objects a read shows, per role, from plain answers (guard.policy.read_filter)."""

from __future__ import annotations

import textwrap
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from gateway.guard.policy.evaluate import evaluate
from gateway.guard.policy.model import CallFacts, Policy
from gateway.guard.policy.parse import parse_policy_text
from gateway.guard.policy.read_filter import (
    ReadFilter,
    Shaping,
    Subject,
    VmFacts,
    filter_answer,
    read_args,
    read_filter,
    unreachable_rules,
)
from gateway.tools.registry import tool_categories
from gateway.vocabulary import Category, Risk

NOW = datetime(2026, 3, 4, 12, 0, tzinfo=UTC)
RULES = """
rules:
  - name: hide-db
    match: {roles: [reader], tools: [read], vm_patterns: ["db-*"]}
    action: deny
  - name: hide-secret-folder
    match: {roles: [reader], tools: [read], folders: ["*/secret*"]}
    action: deny
  - name: hide-pool
    match: {roles: [reader], tools: [list_vms], resource_pools: [finance]}
    action: deny
  - name: hide-host
    match: {roles: [reader], tools: [read], names: [esx-9, host-77]}
    action: deny
"""
VMS = VmFacts.of_rows([
    {"moid": "vm-1", "name": "web-1", "folder": "/DC0/vm", "resource_pool": "Resources"},
    {"moid": "vm-2", "name": "db-1", "folder": "/DC0/vm", "resource_pool": "Resources"},
    {"moid": "vm-3", "name": "app-1", "folder": "/DC0/vm/secret", "resource_pool": "Resources"},
    {"moid": "vm-4", "name": "pay-1", "folder": "/DC0/vm", "resource_pool": "finance"},
])


def rules_for(role: str, tool: str, text: str = RULES) -> ReadFilter | None:
    policy = parse_policy_text(textwrap.dedent(text), "rules.yaml")
    call = CallFacts(tool=tool, category=Category.READ, risk=Risk.LOW, target="vc1", target_tags=(),
                     affected=(), caller="someone", role=role)
    return read_filter(policy, call, NOW)


def vm_rows(*names: str, **extra: Any) -> dict[str, Any]:
    rows = [{"moid": s.moid, "name": s.name, **extra} for s in VMS.by_moid.values() if s.name in names]
    return {"vms": rows, "count": len(rows)}


def shown_names(answer: dict[str, Any] | None, key: str = "vms") -> list[str]:
    assert answer is not None
    return [row["name"] for row in answer[key]]


ALL_VMS = ("web-1", "db-1", "app-1", "pay-1")

LISTING_CASES: list[tuple[str, str, str, list[str], int]] = [
    ("reader-list-vms", "reader", "list_vms", ["web-1"], 3),
    ("admin-sees-all", "admin", "list_vms", list(ALL_VMS), 0),
]


@pytest.mark.parametrize(("role", "tool", "shown", "withheld"), [c[1:] for c in LISTING_CASES],
                         ids=[c[0] for c in LISTING_CASES])
def test_a_listing_leaves_hidden_vms_out_and_counts_them(role: str, tool: str, shown: list[str],
                                                         withheld: int) -> None:
    rules = rules_for(role, tool)
    answer = vm_rows(*ALL_VMS)
    filtered = filter_answer(tool, answer, rules, VMS)
    assert sorted(shown_names(filtered.answer)) == sorted(shown)
    if rules is None:
        assert "withheld" not in (filtered.answer or {})
    else:
        assert filtered.withheld == withheld and filtered.answer and filtered.answer["withheld"] == withheld
        assert filtered.answer["count"] == len(shown)
    assert len(answer["vms"]) == 4, "the answer given (a mirror's kept one) is never changed"


def test_no_rule_with_object_fields_means_no_filter() -> None:
    assert rules_for("admin", "list_vms") is None
    plain = "rules:\n  - {name: no-reads, match: {roles: [watcher], tools: [read]}, action: deny}\n"
    assert rules_for("reader", "list_vms", plain) is None
    assert rules_for("reader", "list_targets") is not None  # judged, though it shows nothing


def test_rows_without_folder_are_judged_by_the_vm_facts() -> None:
    rows = {"vms": [{"moid": "vm-3", "power_state": "poweredOn"}, {"moid": "vm-1"}], "count": 2}
    filtered = filter_answer("list_vms", rows, rules_for("reader", "list_vms"), VMS)
    assert filtered.answer is not None and filtered.answer["vms"] == [{"moid": "vm-1"}]


def test_without_facts_a_vm_is_judged_by_name_only() -> None:
    filtered = filter_answer("list_vms", vm_rows(*ALL_VMS), rules_for("reader", "list_vms"))
    assert sorted(shown_names(filtered.answer)) == ["app-1", "pay-1", "web-1"]  # db-* only


def test_a_filtered_listing_is_cut_at_the_callers_limit_after_filtering() -> None:
    args, shaping = read_args("list_vms", {"target": "vc1", "fields": ["name"], "limit": 1}, True)
    assert args == {"target": "vc1", "fields": ["name", "moid"]}
    assert shaping == Shaping(limit=1, drop_moid=True)
    answer = vm_rows(*ALL_VMS)
    filtered = filter_answer("list_vms", answer, rules_for("reader", "list_vms"), VMS, shaping)
    assert filtered.answer == {"vms": [{"name": "web-1"}], "count": 1, "withheld": 3}
    unfiltered = filter_answer("list_vms", answer, None, VMS, shaping)
    assert unfiltered.answer is not None and len(unfiltered.answer["vms"]) == 1
    assert unfiltered.answer["truncated"] is True and "withheld" not in unfiltered.answer
    assert read_args("list_hosts", {"target": "vc1"}, True) == ({"target": "vc1"}, Shaping())
    assert read_args("list_vms", {"target": "vc1", "limit": 2}, False)[0] == {"target": "vc1", "limit": 2}


SINGLE_CASES: list[tuple[str, str, dict[str, Any], str | None]] = [
    ("details-by-folder", "get_vm_details", {"moid": "vm-3", "name": "app-1", "folder": "/DC0/vm/secret"},
     "rule:hide-secret-folder"),
    ("snapshots-by-pattern", "list_snapshots", {"vm": "db-1", "vm_moid": "vm-2", "snapshots": []},
     "rule:hide-db"),
    ("performance-by-pattern", "get_vm_performance", {"vm": "db-1", "vm_moid": "vm-2"}, "rule:hide-db"),
    ("customization-shown", "get_customization_status", {"vm": "web-1", "vm_moid": "vm-1"}, None),
    ("pool-rule-is-for-list-vms-only", "get_vm_details", {"moid": "vm-4", "name": "pay-1"}, None),
    ("host-by-name", "get_host_details", {"moid": "host-1", "name": "esx-9"}, "rule:hide-host"),
    ("host-by-moid", "get_host_details", {"moid": "host-77", "name": "esx-1"}, "rule:hide-host"),
]


@pytest.mark.parametrize(("tool", "answer", "denied"), [c[1:] for c in SINGLE_CASES],
                         ids=[c[0] for c in SINGLE_CASES])
def test_a_read_about_one_hidden_object_is_refused(tool: str, answer: dict[str, Any],
                                                   denied: str | None) -> None:
    filtered = filter_answer(tool, answer, rules_for("reader", tool), VMS)
    assert filtered.denied == denied
    assert (filtered.answer is None) == (denied is not None)
    assert filter_answer(tool, answer, rules_for("admin", tool), VMS).denied is None


def test_host_details_leave_hidden_vm_names_out() -> None:
    answer = {"moid": "host-1", "name": "esx-1", "vms": ["web-1", "db-1", "app-1"]}
    filtered = filter_answer("get_host_details", answer, rules_for("reader", "get_host_details"), VMS)
    assert filtered.answer is not None and filtered.answer["vms"] == ["web-1"] and filtered.withheld == 2


NESTED_CASES: list[tuple[str, str, dict[str, Any], dict[str, Any], int]] = [
    ("cluster-hosts", "get_cluster_details",
     {"moid": "domain-c1", "name": "C0", "datastores": ["ds1"],
      "hosts": [{"moid": "host-1", "name": "esx-1"}, {"moid": "host-77", "name": "esx-2"}]},
     {"hosts": [{"moid": "host-1", "name": "esx-1"}], "datastores": ["ds1"]}, 1),
    ("datastore-mounts-and-vms", "get_datastore_details",
     {"moid": "datastore-1", "name": "ds1", "hosts": [{"host": "esx-9"}, {"host": "esx-1"}],
      "vms": ["db-1", "web-1"]},
     {"hosts": [{"host": "esx-1"}], "vms": ["web-1"]}, 2),
    ("vm-details-lists", "get_vm_details",
     {"moid": "vm-1", "name": "web-1", "datastores": ["ds1"], "networks": ["VM Network"]},
     {"datastores": ["ds1"], "networks": ["VM Network"]}, 0),
]


@pytest.mark.parametrize(("tool", "answer", "kept", "withheld"), [c[1:] for c in NESTED_CASES],
                         ids=[c[0] for c in NESTED_CASES])
def test_lists_inside_details_leave_hidden_objects_out(tool: str, answer: dict[str, Any],
                                                       kept: dict[str, Any], withheld: int) -> None:
    filtered = filter_answer(tool, answer, rules_for("reader", tool), VMS)
    assert filtered.answer is not None and filtered.withheld == withheld
    assert {k: filtered.answer[k] for k in kept} == kept and filtered.answer["withheld"] == withheld


def test_events_and_tasks_about_hidden_objects_are_withheld() -> None:
    events = {"events": [{"key": 1, "vm": "app-1", "vm_moid": "vm-3"}, {"key": 2, "vm": "web-1"},
                         {"key": 3, "host": "esx-9"}, {"key": 4, "message": "no entity"}],
              "count": 4, "matched": 4}
    filtered = filter_answer("get_events", events, rules_for("reader", "get_events"), VMS)
    assert filtered.answer is not None and [e["key"] for e in filtered.answer["events"]] == [2, 4]
    assert (filtered.withheld, filtered.answer["count"], filtered.answer["matched"]) == (2, 2, 2)
    tasks = {"tasks": [{"key": "t1", "entity": "db-1", "entity_moid": "vm-2"},
                       {"key": "t2", "entity": "web-1", "entity_moid": "vm-1"}], "count": 2}
    shown = filter_answer("get_tasks", tasks, rules_for("reader", "get_tasks"), VMS)
    assert shown.answer is not None and [t["key"] for t in shown.answer["tasks"]] == ["t2"]


TOOLS = tool_categories()

UNREACHABLE_CASES: list[tuple[str, str, list[str]]] = [
    ("vm-pattern-on-list-hosts", "{tools: [list_hosts], vm_patterns: [x]}",
     ["rules[0].match.vm_patterns: can never apply: list_hosts shows no VM"]),
    ("folder-on-datastores", "{tools: [list_datastores, list_clusters], folders: [x]}",
     ["rules[0].match.folders: can never apply: list_clusters, list_datastores show no VM"]),
    ("folder-on-datastore-details", "{tools: [get_datastore_details], folders: [x]}", []),  # its VM names
    ("names-on-list-targets", "{tools: [list_targets], names: [x]}",
     ["rules[0].match.names: can never apply: list_targets shows no inventory object"]),
    ("vm-pattern-on-reads", "{tools: [read], vm_patterns: [x]}", []),
    ("vm-pattern-on-a-glob", "{tools: [\"list_*\"], vm_patterns: [x]}", []),
    ("names-on-hosts", "{tools: [list_hosts], names: [x]}", []),
    ("no-tools-named", "{vm_patterns: [x]}", []),
    ("writes-carry-vms", "{tools: [power_off_vm], folders: [x]}", []),
]


@pytest.mark.parametrize(("match", "expected"), [c[1:] for c in UNREACHABLE_CASES],
                         ids=[c[0] for c in UNREACHABLE_CASES])
def test_unreachable_rules(match: str, expected: list[str]) -> None:
    text = f"rules:\n  - {{name: r, action: deny, match: {match}}}\n"
    policy: Policy = parse_policy_text(text, "rules.yaml")
    problems = unreachable_rules(policy, TOOLS)
    assert len(problems) == len(expected), problems
    for want, got in zip(expected, problems, strict=True):
        assert got.startswith("rules.yaml:2:5: ") and want in got


EQUIVALENCE_RULES = RULES + """
  - name: readers-see-nothing-else
    match: {roles: [auditor], tools: [read]}
    action: deny
  - name: web-is-fine
    match: {roles: [reader], vm_patterns: ["web-*"]}
    action: allow
"""


@pytest.mark.parametrize("role", ["reader", "admin", "auditor"])
@pytest.mark.parametrize("tool", ["list_vms", "get_vm_details", "get_events"])
def test_the_filter_decides_each_object_as_the_whole_policy_would(role: str, tool: str) -> None:
    """The filter evaluates objects over the rules that can matter only; each verdict is the one the
    whole policy gives a call affecting that one object (when the read itself is allowed)."""
    policy = parse_policy_text(textwrap.dedent(EQUIVALENCE_RULES), "rules.yaml")
    call = CallFacts(tool=tool, category=Category.READ, risk=Risk.LOW, target="vc1", target_tags=(),
                     affected=(), caller="someone", role=role)
    read_allowed = evaluate(call, policy, NOW).allowed
    rules = read_filter(policy, call, NOW)
    for subject in [*VMS.by_moid.values(), Subject("host", "esx-9", "host-1"), Subject("vm", None)]:
        whole = evaluate(replace(call, affected=(subject.affected(),)), policy, NOW).allowed
        if read_allowed:
            assert (rules is not None and rules.hides(subject) is not None) == (not whole), subject
