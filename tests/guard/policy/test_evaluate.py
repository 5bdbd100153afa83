"""gateway.guard.policy.evaluate: the order of protected, bulk, rules, target settings and windows."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from gateway.guard.policy.evaluate import evaluate
from gateway.guard.policy.model import CallFacts, Decision, Policy
from gateway.guard.policy.parse import parse_policy
from gateway.vocabulary import AffectedObject, Category, Risk

#: a Wednesday, mid-day UTC
NOW = datetime(2026, 3, 4, 12, 0, tzinfo=UTC)


def vm(name: str, moid: str = "vm-1") -> AffectedObject:
    return AffectedObject("vm", name, moid)


def call(**changes: Any) -> CallFacts:
    base = CallFacts(tool="power_off_vm", category=Category.WRITE, risk=Risk.MEDIUM, target="dev",
                     target_tags=(), affected=(vm("web-1"),), caller="agent", role="operator")
    return replace(base, **changes)


DESTROY: dict[str, Any] = {"tool": "delete_vm", "category": Category.DESTRUCTIVE, "risk": Risk.CRITICAL}
READ: dict[str, Any] = {"tool": "list_vms", "category": Category.READ, "risk": Risk.LOW, "affected": ()}


def rules(**sections: Any) -> Policy:
    return parse_policy(sections, "rules.yaml")


def decide(policy: Policy, now: datetime = NOW, **changes: Any) -> Decision:
    return evaluate(call(**changes), policy, now)


def test_a_naive_now_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        evaluate(call(), Policy("rules.yaml"), datetime(2026, 3, 4, 12, 0))


def test_evaluate_is_pure() -> None:
    policy = rules(rules=[{"name": "r", "action": "deny", "match": {"targets": ["dev"]}}])
    assert decide(policy) == decide(policy)


# --------------------------------------------------------------------------- built-in defaults


@pytest.mark.parametrize(("changes", "allowed"), [
    (READ, True),
    ({}, True),
    (DESTROY, False),
])
def test_builtin_defaults(changes: dict[str, Any], allowed: bool) -> None:
    decision = decide(Policy("rules.yaml", builtin=True), **changes)
    assert decision.allowed is allowed
    assert decision.rule == "defaults"
    assert not decision.require_approval


def test_a_denied_category_says_how_to_permit_it() -> None:
    decision = decide(Policy("rules.yaml"), **DESTROY)
    assert decision.reason == ("destructive calls are denied on target 'dev' (defaults); to permit them set "
                               "'destructive: allow' under defaults or targets.dev in rules.yaml")


def test_an_allowed_category_names_the_layer() -> None:
    decision = decide(rules(targets={"dev": {"write": "allow"}}))
    assert decision.allowed and decision.rule == "targets:dev"
    assert decision.reason == "write calls are allowed on target 'dev' (targets:dev)"


def test_a_category_requiring_approval() -> None:
    decision = decide(rules(defaults={"write": "require_approval"}))
    assert decision.allowed and decision.require_approval
    assert decision.reason == "write calls on target 'dev' require a human approval (defaults)"


# --------------------------------------------------------------------------- protected


PROTECTED = rules(protected=[{"name": "crown", "vm_patterns": ["db-*"], "reason": "customer data"}],
                  defaults={"destructive": "allow"})


def test_protected_objects_refuse_destructive_calls() -> None:
    decision = decide(PROTECTED, **DESTROY, affected=(vm("web-1", "vm-1"), vm("db-1", "vm-2")))
    assert not decision.allowed
    assert decision.rule == "protected:crown"
    assert decision.reason == ("vm 'db-1' (vm-2) is protected by 'crown': customer data; override does not "
                               "apply (change 'protected' in rules.yaml to allow it)")


def test_override_does_not_lift_protection() -> None:
    assert not decide(PROTECTED, **DESTROY, affected=(vm("db-1"),), override=True).allowed


def test_unprotected_objects_pass_on_to_the_settings() -> None:
    assert decide(PROTECTED, **DESTROY, affected=(vm("web-1"),)).allowed


def test_protection_of_writes_needs_a_min_risk_level() -> None:
    policy = rules(protected=[{"name": "p", "vm_patterns": ["db-*"], "min_risk_level": "high"}])
    assert decide(policy, affected=(vm("db-1"),), risk=Risk.MEDIUM).allowed
    denied = decide(policy, affected=(vm("db-1"),), risk=Risk.HIGH)
    assert not denied.allowed and denied.rule == "protected:p"
    assert denied.reason.startswith("vm 'db-1' (vm-1) is protected by 'p'; override")


def test_protection_comes_before_an_allow_rule() -> None:
    policy = rules(protected=[{"name": "p", "names": ["vm-1"]}],
                   rules=[{"name": "all", "action": "allow"}])
    assert decide(policy, **DESTROY).rule == "protected:p"


# --------------------------------------------------------------------------- bulk


def test_a_call_over_the_bulk_limit_is_denied() -> None:
    decision = decide(rules(defaults={"max_bulk_objects": 2}), object_count=3)
    assert not decision.allowed and decision.rule == "defaults"
    assert "would change 3 objects on target 'dev', more than its limit of 2" in decision.reason


def test_the_bulk_limit_names_the_layer_that_set_it() -> None:
    assert decide(rules(targets={"d*": {"max_bulk_objects": 1}}), object_count=2).rule == "targets:d*"


@pytest.mark.parametrize(("count", "allowed"), [(2, True), (1, True), (0, True), (3, False)])
def test_bulk_limit_boundary(count: int, allowed: bool) -> None:
    assert decide(rules(defaults={"max_bulk_objects": 2}), object_count=count).allowed is allowed


def test_reads_have_no_bulk_limit() -> None:
    assert decide(rules(defaults={"max_bulk_objects": 1}), **READ, object_count=50).allowed


def test_no_bulk_limit_when_null() -> None:
    assert decide(rules(defaults={"max_bulk_objects": None}), object_count=10_000).allowed


def test_bulk_comes_before_rules() -> None:
    policy = rules(defaults={"max_bulk_objects": 1}, rules=[{"name": "ok", "action": "allow"}])
    assert not decide(policy, object_count=2).allowed


# --------------------------------------------------------------------------- rules


@pytest.mark.parametrize(("action", "allowed", "approval", "reason"), [
    ("deny", False, False, "denied by rule 'r': because"),
    ("allow", True, False, "allowed by rule 'r': because"),
    ("require_approval", True, True, "rule 'r' requires a human approval: because"),
])
def test_the_first_matching_rule_decides(action: str, allowed: bool, approval: bool, reason: str) -> None:
    policy = rules(rules=[{"name": "other", "action": "deny", "match": {"targets": ["prod"]}},
                          {"name": "r", "action": action, "reason": "because"},
                          {"name": "later", "action": "deny"}])
    decision = decide(policy)
    assert (decision.allowed, decision.require_approval, decision.reason) == (allowed, approval, reason)
    assert decision.rule == "rule:r"


def test_a_rule_without_a_reason() -> None:
    assert decide(rules(rules=[{"name": "r", "action": "allow"}])).reason == "allowed by rule 'r'"


def test_an_allow_rule_must_name_every_affected_vm() -> None:
    policy = rules(defaults={"write": "deny"},
                   rules=[{"name": "web", "action": "allow", "match": {"vm_patterns": ["web-*"]}}])
    assert decide(policy, affected=(vm("web-1"),)).allowed
    assert not decide(policy, affected=(vm("web-1"), vm("db-1", "vm-2"))).allowed


OVERRIDABLE = rules(rules=[
    {"name": "no-prod", "action": "deny", "unless_override": True},
    {"name": "no-friday", "action": "deny", "unless_override": True, "match": {"tools": ["power_*"]}},
])


def test_a_deny_unless_override_says_how_to_skip_it() -> None:
    decision = decide(OVERRIDABLE)
    assert not decision.allowed and decision.rule == "rule:no-prod"
    assert decision.reason.endswith("; override=true skips this rule (the rest of the policy still applies)")


def test_override_skips_every_overridable_deny_and_the_settings_decide() -> None:
    decision = decide(OVERRIDABLE, override=True)
    assert decision.allowed and decision.rule == "defaults"
    assert decision.overridden == ("no-prod", "no-friday")
    assert decision.reason.endswith(" (override=true skipped deny rules 'no-prod', 'no-friday')")


def test_override_never_grants_more_than_the_rest_of_the_policy() -> None:
    policy = rules(rules=[{"name": "soft", "action": "deny", "unless_override": True}], **{})
    decision = decide(policy, **DESTROY, override=True)
    assert not decision.allowed and decision.rule == "defaults"
    assert decision.overridden == ("soft",)
    assert decision.reason.endswith(" (override=true skipped deny rule 'soft')")


def test_override_stops_at_a_hard_deny() -> None:
    policy = rules(rules=[{"name": "soft", "action": "deny", "unless_override": True},
                          {"name": "hard", "action": "deny"}])
    decision = decide(policy, override=True)
    assert not decision.allowed and decision.rule == "rule:hard"
    assert decision.overridden == ("soft",)


# --------------------------------------------------------------------------- approvals


def test_web_approval_gates_allowed_destructive_calls() -> None:
    policy = rules(defaults={"destructive": "allow", "require_web_approval": True})
    decision = decide(policy, **DESTROY)
    assert decision.allowed and decision.require_approval
    assert decision.reason.endswith("; target 'dev' requires a human approval for destructive calls "
                                    "(require_web_approval)")


def test_web_approval_leaves_writes_alone() -> None:
    decision = decide(rules(defaults={"require_web_approval": True}))
    assert decision.allowed and not decision.require_approval


def test_n_of_m_of_the_target() -> None:
    policy = rules(defaults={"write": "require_approval", "approvals_required": 3,
                             "approver_roles": ["lead", "sre"], "reason_required": True})
    decision = decide(policy)
    assert (decision.approvals_required, decision.approver_roles, decision.reason_required) == (
        3, ("lead", "sre"), True)
    assert decision.reason.endswith("; 3 distinct approvals needed; approvers of role lead, sre; "
                                    "a reason is required")


def test_a_rule_raises_the_count_and_names_its_roles() -> None:
    policy = rules(defaults={"approvals_required": 2, "approver_roles": ["sre"]},
                   rules=[{"name": "gate", "action": "require_approval", "approvals_required": 1,
                           "approver_roles": ["lead"], "reason_required": True}])
    decision = decide(policy)
    assert decision.approvals_required == 2
    assert decision.approver_roles == ("lead",)
    assert decision.reason_required


def test_a_single_approval_adds_no_note() -> None:
    decision = decide(rules(rules=[{"name": "gate", "action": "require_approval"}]))
    assert decision.reason == "rule 'gate' requires a human approval"
    assert decision.approvals_required == 1 and decision.approver_roles == ()


def test_confirm_by_comes_from_the_deciding_rule_else_the_target() -> None:
    policy = rules(defaults={"confirm_by": "either"},
                   rules=[{"name": "el", "action": "require_approval", "confirm_by": "elicitation",
                           "match": {"tools": ["delete_vm"]}}])
    assert decide(policy, **DESTROY).confirm_by == "elicitation"
    assert decide(policy).confirm_by == "either"
    assert decide(Policy("rules.yaml")).confirm_by == "tool"


@pytest.mark.parametrize("changes", [{}, DESTROY])
def test_flags_travel_with_every_decision(changes: dict[str, Any]) -> None:
    policy = rules(defaults={"dry_run": True, "auto_snapshot_before_destroy": False})
    decision = decide(policy, **changes)
    assert decision.dry_run is True and decision.auto_snapshot is False


# --------------------------------------------------------------------------- maintenance windows


NIGHT = rules(maintenance_windows=[{"name": "night", "start": "22:00", "end": "06:00"}],
              defaults={"destructive": "allow"})


def test_a_high_risk_call_outside_its_window_is_denied_naming_the_next_opening() -> None:
    decision = decide(NIGHT, risk=Risk.HIGH)
    assert not decision.allowed and decision.rule == "window:night"
    assert decision.reason == ("high-risk calls on target 'dev' may run only inside a maintenance window; "
                               "the next is 'night' (every day 22:00-06:00 UTC), opening "
                               "2026-03-04 22:00 UTC (in 10h 0m)")


@pytest.mark.parametrize(("now", "span"), [
    (datetime(2026, 3, 4, 21, 59, 30, tzinfo=UTC), "in 0m"),
    (datetime(2026, 3, 4, 21, 15, tzinfo=UTC), "in 45m"),
    (datetime(2026, 3, 4, 6, 30, tzinfo=UTC), "in 15h 30m"),
])
def test_the_span_to_the_next_opening(now: datetime, span: str) -> None:
    assert decide(NIGHT, now, risk=Risk.CRITICAL).reason.endswith(f"({span})")


def test_a_window_a_few_days_away_counts_days() -> None:
    policy = rules(maintenance_windows=[{"name": "sun", "start": "02:00", "end": "04:00", "days": ["sun"]}])
    assert decide(policy, risk=Risk.HIGH).reason.endswith("(in 3d 14h 0m)")


def test_inside_the_window_the_call_is_allowed() -> None:
    assert decide(NIGHT, datetime(2026, 3, 4, 23, 0, tzinfo=UTC), risk=Risk.HIGH).allowed


@pytest.mark.parametrize("risk", [Risk.LOW, Risk.MEDIUM])
def test_windows_leave_lower_risks_alone(risk: Risk) -> None:
    assert decide(NIGHT, risk=risk).allowed


def test_windows_apply_to_their_targets_only() -> None:
    policy = rules(maintenance_windows=[{"name": "n", "start": "22:00", "end": "06:00",
                                         "targets": ["prod-*"]}])
    assert decide(policy, risk=Risk.HIGH).allowed
    assert not decide(policy, risk=Risk.HIGH, target="prod-1").allowed


def test_any_open_window_is_enough_and_the_earliest_is_named() -> None:
    policy = rules(maintenance_windows=[
        {"name": "late", "start": "23:00", "end": "23:30"},
        {"name": "soon", "start": "13:00", "end": "14:00"},
    ])
    assert decide(policy, risk=Risk.HIGH).rule == "window:soon"
    assert decide(policy, datetime(2026, 3, 4, 23, 10, tzinfo=UTC), risk=Risk.HIGH).allowed


def test_windows_gate_calls_that_need_approval_too() -> None:
    policy = rules(maintenance_windows=[{"name": "night", "start": "22:00", "end": "06:00"}],
                   rules=[{"name": "gate", "action": "require_approval"}])
    assert decide(policy, risk=Risk.HIGH).rule == "window:night"


def test_a_denied_call_is_not_told_about_windows() -> None:
    policy = rules(maintenance_windows=[{"name": "night", "start": "22:00", "end": "06:00"}],
                   rules=[{"name": "no", "action": "deny"}])
    assert decide(policy, risk=Risk.HIGH).rule == "rule:no"


def test_a_window_denial_keeps_the_overridden_rules() -> None:
    policy = rules(maintenance_windows=[{"name": "night", "start": "22:00", "end": "06:00"}],
                   rules=[{"name": "soft", "action": "deny", "unless_override": True}])
    decision = decide(policy, risk=Risk.HIGH, override=True)
    assert decision.rule == "window:night" and decision.overridden == ("soft",)
