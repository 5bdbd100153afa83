"""gateway.guard.policy.replay: audit rows decided again under the rules in force and a candidate."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gateway.guard.policy.model import Policy
from gateway.guard.policy.parse import parse_policy
from gateway.guard.policy.replay import (
    ALLOWED,
    APPROVAL,
    DENIED,
    Report,
    ToolFacts,
    World,
    calls_of,
    replay,
)
from gateway.role import BUILTIN_ROLES, Role
from gateway.vocabulary import Category, Risk

#: a Wednesday, mid-day UTC
NOON = datetime(2026, 3, 4, 12, 0, tzinfo=UTC).timestamp()

TOOLS = {
    "list_targets": ToolFacts(Category.READ, Risk.LOW, policy_decides=False),
    "list_vms": ToolFacts(Category.READ, Risk.LOW),
    "power_on_vm": ToolFacts(Category.WRITE, Risk.MEDIUM),
    "power_off_vm": ToolFacts(Category.WRITE, Risk.HIGH),
    "delete_vm": ToolFacts(Category.DESTRUCTIVE, Risk.CRITICAL),
    "bulk_vm_action": ToolFacts(Category.DESTRUCTIVE, Risk.CRITICAL,
                                reaches=lambda args: (str(args["action"]),) if "action" in args else ()),
    "confirm_action": ToolFacts(Category.DESTRUCTIVE, Risk.CRITICAL, policy_decides=False),
}
WORLD = World(TOOLS, {**BUILTIN_ROLES, "ops": Role("ops", tools="*", targets=("vc1",))},
              {"vc1": ("env:prod",), "vc2": ()})
OPEN = {"defaults": {"read": "allow", "write": "allow", "destructive": "allow"}}


def rules(**sections: Any) -> Policy:
    return parse_policy({**OPEN, **sections}, "rules.yaml")


def row(seq: int, phase: str, tool: str, target: str | None = "vc1", *, at: float = NOON,
        **fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"seq": seq, "ts": datetime.fromtimestamp(at, UTC).isoformat(), "ts_epoch": at,
                           "phase": phase, "tool": tool, "caller": "agent-a", "caller_key": "token:t1",
                           "kind": "agent", "role": "admin", "surface": "https",
                           "risk": TOOLS[tool].risk.value if tool in TOOLS else "critical",
                           "correlation_id": f"c{seq}", "args": {"target": target, "vm": "web-1"}}
    if target is not None:
        out["target"] = target
    out.update(fields)
    return out


def vm(name: str, moid: str = "vm-1") -> dict[str, str]:
    return {"type": "vm", "name": name, "moid": moid}


#: a recorded session: a read, a power-on, a power-off (each change an intent and an outcome row)
SESSION = [
    row(1, "call", "list_vms", outcome="ok"),
    row(2, "executing", "power_on_vm"),
    row(3, "executed", "power_on_vm", outcome="ok"),
    row(4, "executing", "power_off_vm"),
    row(5, "executed", "power_off_vm", outcome="ok"),
    row(6, "executing", "power_off_vm", at=NOON + 60),
    row(7, "failed", "power_off_vm", at=NOON + 60, outcome="vsphere_error", error_code="vsphere_error"),
]
def deny(name: str, **match: Any) -> dict[str, Any]:
    return {"name": name, "action": "deny", "match": match}


NO_POWER_OFF = [deny("no-power-off", tools=["power_off_vm"])]
PROD_DELETES = [deny("prod-deletes", tools=["delete_vm"], vm_patterns=["prod-*"])]


def changes(report: Report) -> list[tuple[int | None, str, str]]:
    return [(c.call.seq, c.change, c.now.rule) for c in report.changes]


def test_a_candidate_denying_power_off_changes_exactly_the_power_off_calls() -> None:
    report = replay(SESSION, rules(), rules(rules=NO_POWER_OFF), WORLD)
    assert changes(report) == [(4, "allowed -> denied", "rule:no-power-off"),
                               (6, "allowed -> denied", "rule:no-power-off")]
    assert (report.rows, report.calls, report.unchanged, report.not_replayed) == (7, 4, 2, {})
    group = report.ordered_groups[0]
    assert (group.change, group.rule, group.count, dict(group.was_rules)) == (
        "allowed -> denied", "rule:no-power-off", 2, {"defaults": 2})


def test_the_same_rules_change_nothing() -> None:
    report = replay(SESSION, rules(rules=NO_POWER_OFF), rules(rules=NO_POWER_OFF), WORLD)
    assert report.changes == [] and report.calls == 4


def test_an_outcome_row_is_not_a_second_call_but_a_refusal_at_the_gate_is_a_call() -> None:
    refused_at_plan = row(8, "failed", "power_off_vm", error_code="not_found", reason="no VM")
    assert calls_of(SESSION[2], WORLD) == "the outcome of a change already counted (its intent row)"
    assert isinstance(calls_of(refused_at_plan, WORLD), list)


def test_the_candidate_is_compared_with_the_rules_in_force_replayed_not_with_the_recorded_outcome() -> None:
    # a call refused by a rate limit (recorded: denied) is allowed by both sets of rules: unchanged
    limited = row(1, "denied", "power_on_vm", error_code="rate_limited")
    report = replay([limited], rules(), rules(rules=NO_POWER_OFF), WORLD)
    assert report.changes == [] and report.unchanged == 1


def test_a_denied_call_the_candidate_allows() -> None:
    deny_writes = rules(rules=[deny("no-writes", tools=["write"])])
    denied = row(1, "denied", "power_on_vm", error_code="policy_denied",
                 decision={"allowed": False, "rule": "rule:no-writes"})
    report = replay([denied], deny_writes, rules(), WORLD)
    assert changes(report) == [(1, "denied -> allowed", "defaults")]
    assert report.changes[0].was.rule == "rule:no-writes"


def test_approval_required_and_n_of_m_changes() -> None:
    approve = {"name": "ask", "action": "require_approval", "match": {"tools": ["power_off_vm"]}}
    two = {**approve, "approvals_required": 2, "approver_roles": ["admin"]}
    report = replay(SESSION[3:4], rules(), rules(rules=[approve]), WORLD)
    assert changes(report) == [(4, f"{ALLOWED} -> {APPROVAL}", "rule:ask")]
    assert report.changes[0].now.label() == "approval required (1 of any approver)"
    report = replay(SESSION[3:4], rules(rules=[approve]), rules(rules=[two]), WORLD)
    assert changes(report) == [(4, "N of M: 1 of any approver -> 2 of admin", "rule:ask")]


def test_confirm_by_changes_on_a_destructive_proposal_only() -> None:
    proposed = row(1, "proposed", "delete_vm", proposal_id="p1", affected=[vm("web-1")])
    read = row(2, "call", "list_vms", outcome="ok")
    elicit = rules(defaults={**OPEN["defaults"], "confirm_by": "elicitation"})
    report = replay([proposed, read], rules(), elicit, WORLD)
    assert changes(report) == [(1, "confirm_by: tool -> elicitation", "defaults")]


def test_dry_run_on_a_target_changes_its_writes_not_its_reads() -> None:
    dry = rules(targets={"vc1": {"dry_run": True}})
    report = replay(SESSION, rules(), dry, WORLD)
    assert [c for _, c, _ in changes(report)] == ["dry_run: off -> on"] * 3


def test_a_change_whose_row_records_no_objects_is_not_replayed_where_rules_look_at_objects() -> None:
    prod_vms = [deny("prod-vms", tools=["write"], vm_patterns=["prod-*"])]
    report = replay(SESSION, rules(rules=prod_vms), rules(rules=[*prod_vms, *NO_POWER_OFF]), WORLD)
    assert report.changes == [] and report.calls == 1  # the read only: reads are decided without objects
    (reason,) = report.not_replayed
    assert "records no affected objects" in reason and "rule:prod-vms" in reason
    assert report.not_replayed[reason].count == 3


def test_a_rule_on_objects_the_call_does_not_reach_leaves_it_replayable() -> None:
    # the rule matches only deletes: a power-off is decided by the tool rule alone, objects or not
    report = replay(SESSION, rules(rules=PROD_DELETES), rules(rules=[*PROD_DELETES, *NO_POWER_OFF]), WORLD)
    assert [seq for seq, _, _ in changes(report)] == [4, 6] and report.not_replayed == {}


def test_objects_a_proposal_row_records_are_matched() -> None:
    rows = [row(1, "proposed", "delete_vm", proposal_id="p1", affected=[vm("prod-db")]),
            row(2, "proposed", "delete_vm", proposal_id="p2", affected=[vm("test-db", "vm-2")])]
    report = replay(rows, rules(), rules(rules=PROD_DELETES), WORLD)
    assert changes(report) == [(1, "allowed -> denied", "rule:prod-deletes")] and report.unchanged == 1


def test_a_protected_object_of_a_proposal_is_denied() -> None:
    protect = rules(protected=[{"name": "crown", "vm_patterns": ["prod-db"]}])
    rows = [row(1, "proposed", "delete_vm", proposal_id="p1", affected=[vm("prod-db")])]
    assert changes(replay(rows, rules(), protect, WORLD)) == [(1, "allowed -> denied", "protected:crown")]


def test_a_list_of_objects_cut_by_the_audit_bounds_is_not_taken_as_the_whole() -> None:
    cut = row(1, "proposed", "delete_vm", proposal_id="p1", affected=[vm("test-db"), {"more_items": 140}])
    report = replay([cut], rules(), rules(rules=PROD_DELETES), WORLD)
    assert report.changes == [] and len(report.not_replayed) == 1


BULK_DELETE = {"target": "vc1", "action": "delete_vm", "name_regex": "v.*"}


def test_a_bulk_call_is_judged_on_each_object_as_the_tool_it_reaches() -> None:
    no_deletes = [deny("no-deletes", tools=["delete_vm"])]
    bulk = row(1, "proposed", "bulk_vm_action", proposal_id="p1", args=BULK_DELETE,
               affected=[vm("a", "vm-1"), vm("b", "vm-2")])
    snapshots = row(2, "proposed", "bulk_vm_action", proposal_id="p2",
                    args={"target": "vc1", "action": "create_snapshot"}, affected=[vm("a", "vm-1")])
    report = replay([bulk, snapshots], rules(), rules(rules=no_deletes), WORLD)
    assert changes(report) == [(1, "allowed -> denied", "rule:no-deletes")]


def test_a_bulk_limit_judges_the_count_a_proposal_records() -> None:
    bulk = row(1, "proposed", "bulk_vm_action", proposal_id="p1", args=BULK_DELETE,
               affected=[vm(f"v{i}", f"vm-{i}") for i in range(3)])
    report = replay([bulk], rules(), rules(targets={"vc1": {"max_bulk_objects": 2}}), WORLD)
    assert [c for _, c, _ in changes(report)] == [f"{ALLOWED} -> {DENIED}"]


def test_a_recorded_object_count_is_the_count_a_bulk_limit_judges() -> None:
    bulk = row(1, "proposed", "bulk_vm_action", proposal_id="p1", args=BULK_DELETE,
               affected=[vm("a", "vm-1")], object_count=5)
    report = replay([bulk], rules(), rules(targets={"vc1": {"max_bulk_objects": 4}}), WORLD)
    assert [c for _, c, _ in changes(report)] == [f"{ALLOWED} -> {DENIED}"]


def test_a_maintenance_window_is_judged_at_the_time_of_each_call() -> None:
    window = [{"name": "nights", "start": "22:00", "end": "06:00", "risk_levels": ["high"]}]
    night = datetime(2026, 3, 4, 23, 0, tzinfo=UTC).timestamp()
    rows = [row(1, "executing", "power_off_vm"), row(2, "executing", "power_off_vm", at=night)]
    report = replay(rows, rules(), rules(maintenance_windows=window), WORLD)
    assert changes(report) == [(1, "allowed -> denied", "window:nights")] and report.unchanged == 1


def test_override_skips_a_deny_rule_marked_unless_override() -> None:
    soft = [{**NO_POWER_OFF[0], "unless_override": True}]
    rows = [row(1, "executing", "power_off_vm", args={"target": "vc1", "vm": "web-1", "override": True}),
            row(2, "executing", "power_off_vm")]
    assert [seq for seq, _, _ in changes(replay(rows, rules(), rules(rules=soft), WORLD))] == [2]


def test_rules_on_callers_roles_and_target_tags_see_the_recorded_call() -> None:
    by = [deny("n", callers=["agent-b"]), deny("r", roles=["ops"]),
          deny("t", target_tags=["env:prod"], tools=["list_vms"])]
    rows = [row(1, "executing", "power_on_vm", caller="agent-b"),
            row(2, "executing", "power_on_vm", role="ops"), row(3, "call", "list_vms", "vc1"),
            row(4, "call", "list_vms", "vc2"), row(5, "executing", "power_on_vm")]
    assert [(s, r) for s, _, r in changes(replay(rows, rules(), rules(rules=by), WORLD))] == [
        (1, "rule:n"), (2, "rule:r"), (3, "rule:t")]


def test_a_fan_out_read_is_one_call_per_target_it_was_decided_on() -> None:
    fan = row(1, "call", "list_vms", "all", outcome="partial",
              outcomes={"vc1": "ok", "vc2": "timeout", "vc3": "policy_denied"})
    calls = calls_of(fan, WORLD)
    assert isinstance(calls, list) and [c.target for c in calls] == ["vc1", "vc2"]
    report = replay([fan], rules(), rules(rules=[deny("no-vc2", targets=["vc2"])]), WORLD)
    assert [(c.call.target, c.change) for c in report.changes] == [("vc2", "allowed -> denied")]


def test_rows_that_record_no_call_are_counted_apart() -> None:
    rows = [{"seq": 1, "phase": "config_reload", "ts": "2026-03-04T12:00:00Z"},
            row(2, "executed", "delete_vm", proposal_id="p1", outcome="ok"),
            row(3, "denied", "delete_vm", proposal_id="p1", via="confirm_action",
                error_code="approval_required"),
            row(4, "call", "list_targets", None, outcome="ok"),
            row(5, "busy", "list_vms")]
    report = replay(rows, rules(), rules(rules=NO_POWER_OFF), WORLD)
    assert (report.rows, report.calls, sum(report.not_calls.values())) == (5, 0, 5)
    assert report.not_calls["a step of an existing proposal (confirm, approve, deny, cancel)"] == 1


def test_calls_today_s_configuration_cannot_place_are_not_replayed_with_why() -> None:
    rows = [row(1, "executing", "power_on_vm", "vc9"), row(2, "executing", "power_on_vm", role="gone"),
            row(3, "executing", "make_coffee"), row(4, "executing", "power_on_vm", role="reader"),
            row(5, "denied", "list_vms", "all", error_code="not_found")]
    report = replay(rows, rules(), rules(rules=NO_POWER_OFF), WORLD)
    reasons = sorted(report.not_replayed)
    assert report.calls == 0 and len(reasons) == 4, reasons
    assert any("target 'vc9'" in r for r in reasons) and any("role 'gone'" in r for r in reasons)
    assert any("no single target" in r for r in reasons) and any("role:reader" in r for r in reasons)
    assert report.not_calls == {"a tool this gateway does not offer (refused before any policy)": 1}


def test_replay_is_pure_and_its_report_is_plain_json_values() -> None:
    import json

    one = replay(SESSION, rules(), rules(rules=NO_POWER_OFF), WORLD).to_dict()
    two = replay(SESSION, rules(), rules(rules=NO_POWER_OFF), WORLD).to_dict()
    assert one == two and json.loads(json.dumps(one)) == one
    assert one["changed"] == 2 and [c["seq"] for c in one["changes"]] == [4, 6]


def test_examples_are_bounded_per_group_and_every_change_is_kept() -> None:
    many = [row(i, "executing", "power_off_vm") for i in range(1, 12)]
    report = replay(many, rules(), rules(rules=NO_POWER_OFF), WORLD, examples=3)
    assert len(report.changes) == 11 and len(report.ordered_groups[0].examples) == 3
    everything = replay(many, rules(), rules(rules=NO_POWER_OFF), WORLD, examples=0)
    assert len(everything.ordered_groups[0].examples) == 11
