"""Policy: rules.yaml semantics (pure, table-driven), strict parsing, and the hot-reloading store."""

from __future__ import annotations

import os
import re
import textwrap
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from support.simulator import complete_rules_text

from gateway.config import ConfigProblems, Target
from gateway.errors import ConfigError
from gateway.guard.decision import Entry, Facts, Party, TokenState, authorize
from gateway.guard.policy.describe import describe
from gateway.guard.policy.evaluate import evaluate
from gateway.guard.policy.model import CallFacts, Decision, Policy
from gateway.guard.policy.parse import SECTIONS, parse_policy, parse_policy_text, section_problems
from gateway.guard.policy.store import PolicyStore, PolicyUnavailable, RulesLoad
from gateway.role import Role
from gateway.vocabulary import AffectedObject, Category, Risk

REPO = Path(__file__).resolve().parents[3]
BERLIN = ZoneInfo("Europe/Berlin")
#: a Wednesday, mid-day UTC
NOW = datetime(2026, 3, 4, 12, 0, tzinfo=UTC)


def vm(name: str, folder: str | None = None, pool: str | None = None, moid: str = "vm-1") -> AffectedObject:
    return AffectedObject("vm", name, moid, folder=folder, resource_pool=pool)


def call(**changes: Any) -> CallFacts:
    base = CallFacts(tool="power_off_vm", category=Category.WRITE, risk=Risk.MEDIUM, target="dev",
                     target_tags=(), affected=(vm("web-1"),), caller="agent", role="operator")
    return replace(base, **changes)


READ: dict[str, Any] = {"tool": "list_vms", "category": Category.READ, "risk": Risk.LOW, "affected": ()}
DESTROY: dict[str, Any] = {"tool": "delete_vm", "category": Category.DESTRUCTIVE, "risk": Risk.CRITICAL}


def policy(text: str) -> Policy:
    return parse_policy_text(textwrap.dedent(text), "rules.yaml")


def decide(text: str, now: datetime = NOW, **changes: Any) -> Decision:
    return evaluate(call(**changes), policy(text), now)


def decided(store: PolicyStore, facts: CallFacts, now: datetime) -> Decision:
    """What the one decision (``guard.decision.authorize``) says of ``facts`` under the rules ``store``
    holds now, as the policy's ``Decision`` (the refusal's own when no rules can be used)."""
    rules, rules_error = store.snapshot()
    role = Role(facts.role, "*", targets="*")
    verdict = authorize(Facts(
        entry=Entry.READ if facts.category is Category.READ else Entry.WRITE,
        actor=Party(facts.caller, TokenState.USABLE, role), tool=facts.tool, category=facts.category,
        risk=facts.risk, now=now, target=facts.target, target_known=True, target_tags=facts.target_tags,
        affected=facts.affected, object_count=facts.object_count, override=facts.override, rules=rules,
        rules_error=rules_error))
    decision = verdict.decision or Decision(verdict.allowed, verdict.reason, verdict.rule)
    return replace(decision, allowed=verdict.allowed, require_approval=verdict.require_approval)


# --------------------------------------------------------------------------- evaluate: table of cases

TARGETS = """
targets:
  "prod-*": {destructive: allow, dry_run: true, max_bulk_objects: 3}
  prod-1: {dry_run: false, auto_snapshot_before_destroy: false}
  lab: {write: deny, destructive: require_approval}
"""
TAGS = """
rules:
  - {name: prod-no-writes, match: {target_tags: ["env:prod"], tools: [write]}, action: deny, reason: frozen}
"""
TOOLS = """
rules:
  - {name: no-power, match: {tools: ["power_*"]}, action: deny}
  - {name: snapshots-ok, match: {tools: [create_snapshot]}, action: allow}
  - {name: no-destroy-names, match: {tools: [destructive]}, action: require_approval}
"""
OBJECTS = """
defaults: {destructive: allow}
rules:
  - {name: no-db, match: {vm_patterns: ["DB-*"]}, action: deny}
  - {name: sandbox, match: {folders: ["/dc/vm/sandbox*"], tools: [write]}, action: allow}
  - {name: gold-pool, match: {resource_pools: [gold]}, action: require_approval}
  - {name: no-sandbox-destroy, match: {folders: ["/dc/vm/sandbox*"], tools: [destructive]}, action: deny}
"""
ALLOW_EVERY = """
rules:
  - {name: test-vms, match: {vm_patterns: ["test-*"], tools: [destructive]}, action: allow}
"""
WHO = """
rules:
  - {name: interns, match: {callers: ["intern-*"], tools: [write, destructive]}, action: deny}
  - {name: readers, match: {roles: [reader]}, action: deny}
"""
RISK = """
rules:
  - {name: high-risk, match: {min_risk_level: high}, action: require_approval}
"""
OVERRIDE = """
defaults: {destructive: allow}
rules:
  - {name: db-guard, match: {vm_patterns: ["db-*"]}, action: deny, unless_override: true, reason: databases}
  - {name: hard-deny, match: {vm_patterns: ["db-core"]}, action: deny}
"""
OVERRIDE_STRICT = """
rules:
  - {name: db-guard, match: {vm_patterns: ["db-*"]}, action: deny, unless_override: true}
"""
PROTECTED = """
defaults: {destructive: allow}
protected:
  - {name: appliances, vm_patterns: ["vcsa-*"], reason: runs the platform}
  - {name: by-moid, names: ["vm-42"], types: [vm]}
  - {name: prod-ds, names: ["backup-*"], types: [datastore], targets: ["prod-*"]}
  - {name: strict, vm_patterns: ["core-*"], min_risk_level: high}
rules:
  - {name: allow-all, action: allow}
"""
ORDER = """
defaults: {destructive: deny}
rules:
  - {name: first-allow, match: {vm_patterns: ["web-*"]}, action: allow}
  - {name: then-deny, match: {tools: [destructive]}, action: deny}
"""
APPROVAL = """
defaults: {write: require_approval, destructive: allow, require_web_approval: true}
"""
BULK = """
defaults: {max_bulk_objects: 2}
targets:
  lab: {max_bulk_objects: null}
rules:
  - {name: allow-all, action: allow}
"""
READS = """
rules:
  - {name: no-reads-for-guests, match: {roles: [guest], tools: [read]}, action: deny}
"""

CASES: list[tuple[str, str, dict[str, Any], bool, str | None, dict[str, Any]]] = [
    # id, policy, call changes, allowed, rule, other Decision fields expected
    ("builtin-read", "", READ, True, "defaults", {"require_approval": False}),
    ("builtin-write", "", {}, True, "defaults", {"dry_run": False, "auto_snapshot": True}),
    ("builtin-destructive", "", DESTROY, False, "defaults", {}),
    ("target-glob-layer", TARGETS, {**DESTROY, "target": "prod-2"}, True, "targets:prod-*",
     {"dry_run": True}),
    ("target-exact-over-glob", TARGETS, {**DESTROY, "target": "prod-1"}, True, "targets:prod-*",
     {"dry_run": False, "auto_snapshot": False}),
    ("target-deny-write", TARGETS, {"target": "lab"}, False, "targets:lab", {}),
    ("target-approval-category", TARGETS, {**DESTROY, "target": "lab"}, True, "targets:lab",
     {"require_approval": True}),
    ("target-other-uses-defaults", TARGETS, {"target": "dev"}, True, "defaults", {"dry_run": False}),
    ("target-name-case-insensitive", TARGETS, {**DESTROY, "target": "PROD-2"}, True, "targets:prod-*", {}),
    ("tag-rule-matches", TAGS, {"target_tags": ("env:prod", "x")}, False, "rule:prod-no-writes", {}),
    ("tag-rule-other-tag", TAGS, {"target_tags": ("env:dev",)}, True, "defaults", {}),
    ("tag-rule-other-category", TAGS, {**READ, "target_tags": ("env:prod",)}, True, "defaults", {}),
    ("tool-glob", TOOLS, {"tool": "power_on_vm"}, False, "rule:no-power", {}),
    ("tool-name", TOOLS, {"tool": "create_snapshot"}, True, "rule:snapshots-ok", {}),
    ("tool-category", TOOLS, DESTROY, True, "rule:no-destroy-names", {"require_approval": True}),
    ("tool-no-match", TOOLS, {"tool": "mount_iso"}, True, "defaults", {}),
    ("vm-pattern-any-in-bulk", OBJECTS, {"affected": (vm("web-1"), vm("db-7"))}, False, "rule:no-db", {}),
    ("vm-pattern-none", OBJECTS, {"affected": (vm("web-1"),)}, True, "defaults", {}),
    ("folder-allow-every", OBJECTS, {"affected": (vm("a", "/dc/vm/sandbox1"), vm("b", "/dc/vm/sandbox2"))},
     True, "rule:sandbox", {}),
    ("folder-allow-not-every", OBJECTS, {"affected": (vm("a", "/dc/vm/sandbox1"), vm("b", "/dc/vm/prod"))},
     True, "defaults", {}),
    ("folder-allow-unknown-folder", OBJECTS, {"affected": (vm("a", "/dc/vm/sandbox1"), vm("b"))},
     True, "defaults", {}),
    ("folder-deny-any", OBJECTS, {**DESTROY, "affected": (vm("a", "/dc/vm/prod"), vm("b", "/dc/vm/sandbox"))},
     False, "rule:no-sandbox-destroy", {}),
    ("pool-any", OBJECTS, {"affected": (vm("a", pool="silver"), vm("b", pool="gold"))},
     True, "rule:gold-pool", {"require_approval": True}),
    ("allow-rule-all-vms", ALLOW_EVERY, {**DESTROY, "affected": (vm("test-1"), vm("test-2"))},
     True, "rule:test-vms", {}),
    ("allow-rule-one-stranger", ALLOW_EVERY, {**DESTROY, "affected": (vm("test-1"), vm("prod-db"))},
     False, "defaults", {}),
    ("allow-rule-no-vms", ALLOW_EVERY, {**DESTROY, "affected": (AffectedObject("host", "test-h", "host-1"),)},
     False, "defaults", {}),
    ("caller-glob", WHO, {"caller": "intern-bob"}, False, "rule:interns", {}),
    ("caller-other", WHO, {"caller": "ops-bot"}, True, "defaults", {}),
    ("role", WHO, {"role": "reader"}, False, "rule:readers", {}),
    ("risk-at-level", RISK, {"risk": Risk.HIGH}, True, "rule:high-risk", {"require_approval": True}),
    ("risk-above-level", RISK, {"risk": Risk.CRITICAL}, True, "rule:high-risk", {"require_approval": True}),
    ("risk-below-level", RISK, {"risk": Risk.MEDIUM}, True, "defaults", {"require_approval": False}),
    ("override-absent", OVERRIDE, {"affected": (vm("db-1"),)}, False, "rule:db-guard", {}),
    ("override-skips-rule", OVERRIDE, {"affected": (vm("db-1"),), "override": True}, True, "defaults",
     {"overridden": ("db-guard",)}),
    ("override-next-rule-still-denies", OVERRIDE, {"affected": (vm("db-core"),), "override": True},
     False, "rule:hard-deny", {"overridden": ("db-guard",)}),
    ("override-grants-nothing-extra", OVERRIDE_STRICT,
     {**DESTROY, "affected": (vm("db-1"),), "override": True}, False, "defaults",
     {"overridden": ("db-guard",)}),
    ("protected-destructive", PROTECTED, {**DESTROY, "affected": (vm("vcsa-01"),)}, False,
     "protected:appliances", {}),
    ("protected-ignores-override", PROTECTED, {**DESTROY, "affected": (vm("VCSA-01"),), "override": True},
     False, "protected:appliances", {}),
    ("protected-in-bulk", PROTECTED, {**DESTROY, "affected": (vm("web-1"), vm("vcsa-01"))}, False,
     "protected:appliances", {}),
    ("protected-write-allowed", PROTECTED, {"affected": (vm("vcsa-01"),)}, True, "rule:allow-all", {}),
    ("protected-by-moid", PROTECTED, {**DESTROY, "affected": (vm("anything", moid="vm-42"),)}, False,
     "protected:by-moid", {}),
    ("protected-type-filter", PROTECTED, {**DESTROY, "target": "prod-1",
                                          "affected": (AffectedObject("datastore", "backup-1", "ds-1"),)},
     False, "protected:prod-ds", {}),
    ("protected-other-target", PROTECTED, {**DESTROY, "target": "dev",
                                           "affected": (AffectedObject("datastore", "backup-1", "ds-1"),)},
     True, "rule:allow-all", {}),
    ("protected-write-high-risk", PROTECTED, {"risk": Risk.HIGH, "affected": (vm("core-1"),)}, False,
     "protected:strict", {}),
    ("protected-write-low-risk", PROTECTED, {"risk": Risk.LOW, "affected": (vm("core-1"),)}, True,
     "rule:allow-all", {}),
    ("protected-never-reads", PROTECTED, {**READ, "risk": Risk.HIGH, "affected": (vm("core-1"),)}, True,
     "rule:allow-all", {}),
    ("first-match-allow", ORDER, {**DESTROY, "affected": (vm("web-1"),)}, True, "rule:first-allow", {}),
    ("first-match-deny", ORDER, {**DESTROY, "affected": (vm("app-1"),)}, False, "rule:then-deny", {}),
    ("category-require-approval", APPROVAL, {}, True, "defaults", {"require_approval": True}),
    ("web-approval-destructive", APPROVAL, DESTROY, True, "defaults", {"require_approval": True}),
    ("web-approval-not-reads", APPROVAL, READ, True, "defaults", {"require_approval": False}),
    ("bulk-over-limit", BULK, {"object_count": 3}, False, "defaults", {}),
    ("bulk-affected-count", BULK, {"affected": (vm("a"), vm("b"), vm("c"))}, False, "defaults", {}),
    ("bulk-at-limit", BULK, {"object_count": 2}, True, "rule:allow-all", {}),
    ("bulk-unlimited-target", BULK, {"object_count": 500, "target": "lab"}, True, "rule:allow-all", {}),
    ("bulk-per-target-glob", TARGETS, {**DESTROY, "target": "prod-9", "object_count": 4}, False,
     "targets:prod-*", {}),
    ("bulk-not-reads", BULK, {**READ, "object_count": 1000}, True, "rule:allow-all", {}),
    ("read-deny-rule", READS, {**READ, "role": "guest"}, False, "rule:no-reads-for-guests", {}),
    ("read-other-role", READS, READ, True, "defaults", {}),
]


@pytest.mark.parametrize(("text", "changes", "allowed", "rule", "extra"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_evaluate(text: str, changes: dict[str, Any], allowed: bool, rule: str | None,
                  extra: dict[str, Any]) -> None:
    decision = decide(text, **changes)
    assert (decision.allowed, decision.rule) == (allowed, rule), decision.reason
    for key, value in extra.items():
        assert getattr(decision, key) == value, decision


def test_reasons_name_the_remedy() -> None:
    denied = decide("", **DESTROY)
    assert "destructive calls are denied on target 'dev'" in denied.reason
    assert "destructive: allow" in denied.reason
    guarded = decide(OVERRIDE, affected=(vm("db-1"),))
    assert guarded.reason == ("denied by rule 'db-guard': databases; override=true skips this rule "
                              "(the rest of the policy still applies)")
    skipped = decide(OVERRIDE, affected=(vm("db-1"),), override=True)
    assert "override=true skipped deny rule 'db-guard'" in skipped.reason
    protected = decide(PROTECTED, affected=(vm("vcsa-01", moid="vm-9"),), override=True, **DESTROY)
    assert "vm 'vcsa-01' (vm-9) is protected by 'appliances': runs the platform" in protected.reason
    assert "override does not apply" in protected.reason
    bulk = decide(BULK, object_count=30)
    assert "30 objects" in bulk.reason and "max_bulk_objects" in bulk.reason


def test_decision_to_dict() -> None:
    decision = decide(OVERRIDE, affected=(vm("db-1"),), override=True)
    assert decision.to_dict() == {
        "allowed": True, "reason": decision.reason, "rule": "defaults", "require_approval": False,
        "dry_run": False, "auto_snapshot": True, "overridden": ["db-guard"],
        "approvals_required": 1, "approver_roles": [], "reason_required": False, "confirm_by": "tool",
    }


def test_target_settings_layers_and_origins() -> None:
    settings = policy(TARGETS + "defaults: {max_calls_per_minute: {write: 60}}\n").target_settings("prod-1")
    assert settings.dry_run is False and settings.origins["dry_run"] == "targets:prod-1"
    assert settings.categories[Category.DESTRUCTIVE].value == "allow"
    assert settings.origins["destructive"] == "targets:prod-*"
    assert settings.max_bulk_objects == 3
    assert settings.rate_limit(Category.WRITE) == 60
    assert settings.rate_limit(Category.DESTRUCTIVE) == 10  # built-in value kept: merged per category
    assert settings.rate_limit(Category.READ) is None


def test_exact_target_entry_wins_whatever_its_position() -> None:
    text = """
    targets:
      prod-1: {destructive: deny}
      "prod-*": {destructive: allow}
    """
    assert decide(text, target="prod-1", **DESTROY).rule == "targets:prod-1"
    assert decide(text, target="prod-2", **DESTROY).allowed


def test_evaluate_needs_an_aware_clock() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        decide("", now=datetime(2026, 3, 4, 12, 0))


# --------------------------------------------------------------------------- maintenance windows

WINDOWS = """
defaults: {destructive: allow}
maintenance_windows:
  - name: weeknights
    targets: ["prod-*"]
    days: [mon, tue, wed, thu, fri]
    start: "22:00"
    end: "06:00"
    timezone: Europe/Berlin
  - name: saturday
    targets: ["prod-*"]
    days: [sat]
    start: "08:00"
    end: "12:00"
    timezone: Europe/Berlin
    risk_levels: [critical]
"""


def berlin(year: int, month: int, day: int, hour: int, minute: int) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=BERLIN)


WINDOW_CASES: list[tuple[str, datetime, dict[str, Any], bool, str]] = [
    # id, now, call changes, allowed, rule
    ("inside-evening", berlin(2026, 3, 4, 23, 0), {"risk": Risk.HIGH}, True, "defaults"),
    ("inside-at-start", berlin(2026, 3, 4, 22, 0), {"risk": Risk.HIGH}, True, "defaults"),
    ("closed-at-end", berlin(2026, 3, 5, 6, 0), {"risk": Risk.HIGH}, False, "window:weeknights"),
    ("wraps-past-midnight-into-saturday", berlin(2026, 3, 7, 3, 0), {"risk": Risk.HIGH}, True, "defaults"),
    ("no-wrap-from-sunday", berlin(2026, 3, 9, 3, 0), {"risk": Risk.HIGH}, False, "window:weeknights"),
    ("midday-closed", berlin(2026, 3, 4, 12, 0), {"risk": Risk.HIGH}, False, "window:weeknights"),
    ("medium-risk-not-covered", berlin(2026, 3, 4, 12, 0), {"risk": Risk.MEDIUM}, True, "defaults"),
    ("other-target-not-covered", berlin(2026, 3, 4, 12, 0), {"risk": Risk.HIGH, "target": "dev"}, True,
     "defaults"),
    ("critical-saturday-window", berlin(2026, 3, 7, 9, 0), {**DESTROY}, True, "defaults"),
    ("high-not-in-saturday-window", berlin(2026, 3, 7, 9, 0), {"risk": Risk.HIGH}, False,
     "window:weeknights"),
    ("utc-clock-converted", datetime(2026, 3, 4, 21, 30, tzinfo=UTC), {"risk": Risk.HIGH}, True, "defaults"),
    ("utc-clock-before-opening", datetime(2026, 3, 4, 20, 30, tzinfo=UTC), {"risk": Risk.HIGH}, False,
     "window:weeknights"),
    ("summer-time-offset", datetime(2026, 7, 8, 20, 30, tzinfo=UTC), {"risk": Risk.HIGH}, True, "defaults"),
]


@pytest.mark.parametrize(("now", "changes", "allowed", "rule"), [c[1:] for c in WINDOW_CASES],
                         ids=[c[0] for c in WINDOW_CASES])
def test_maintenance_windows(now: datetime, changes: dict[str, Any], allowed: bool, rule: str) -> None:
    decision = decide(WINDOWS, now=now, **{"target": "prod-1", **changes})
    assert (decision.allowed, decision.rule) == (allowed, rule), decision.reason


def test_window_denial_names_the_next_opening() -> None:
    saturday_night = berlin(2026, 3, 7, 23, 0)
    decision = decide(WINDOWS, now=saturday_night, target="prod-1", **DESTROY)
    assert decision.rule == "window:weeknights"
    assert "next is 'weeknights' (mon,tue,wed,thu,fri 22:00-06:00 Europe/Berlin)" in decision.reason
    assert "opening 2026-03-09 22:00 CET (in 1d 23h 0m)" in decision.reason
    friday_noon = berlin(2026, 3, 6, 12, 0)
    # Both windows cover a critical call: the one opening first (Friday night) is named.
    assert "opening 2026-03-06 22:00 CET (in 10h 0m)" in decide(WINDOWS, now=friday_noon, target="prod-1",
                                                                  **DESTROY).reason


def test_window_applies_only_on_top_of_an_allow() -> None:
    decision = decide(WINDOWS + "targets: {prod-1: {destructive: deny}}\n", now=berlin(2026, 3, 4, 12, 0),
                      target="prod-1", **DESTROY)
    assert decision.rule == "targets:prod-1"


@pytest.mark.parametrize(("start", "end", "days", "now", "open_"), [
    ("09:00", "17:00", "[wed]", berlin(2026, 3, 4, 16, 59), True),
    ("09:00", "17:00", "[wed]", berlin(2026, 3, 4, 17, 0), False),
    ("09:00", "17:00", "[wed]", berlin(2026, 3, 4, 8, 59), False),
    ("00:00", "00:00", "[wed]", berlin(2026, 3, 4, 23, 59), True),   # start == end: the whole day
    ("00:00", "00:00", "[wed]", berlin(2026, 3, 5, 0, 0), False),
    ("22:00", "00:00", "[wed]", berlin(2026, 3, 4, 23, 59), True),   # end at midnight
    ("22:00", "00:00", "[wed]", berlin(2026, 3, 5, 0, 0), False),
])
def test_window_edges(start: str, end: str, days: str, now: datetime, open_: bool) -> None:
    text = f"""
    maintenance_windows:
      - {{name: w, days: {days}, start: "{start}", end: "{end}", timezone: Europe/Berlin}}
    """
    assert decide(text, now=now, risk=Risk.HIGH).allowed is open_


# --------------------------------------------------------------------------- strict parsing

PARSE_ERRORS: list[tuple[str, str, list[str]]] = [
    ("misspelt-match-key", """
     rules:
       - {name: a, action: deny}
       - {name: b, action: deny}
       - {name: c, match: {vm_pattern: ["db-*"]}, action: deny}
     """, ["rules.yaml:5:23: rules[2].match.vm_pattern: unknown key; did you mean 'vm_patterns'?"]),
    ("unknown-top-key", "rule: []\n", ["rules.yaml:1:1: rule: unknown key; did you mean 'rules'?"]),
    ("bad-category-action", "defaults: {destructive: nope}\n",
     ["rules.yaml:1:12: defaults.destructive: must be one of allow, deny, require_approval"]),
    ("yaml-boolean-action", "defaults: {write: no}\n", ["defaults.write", "boolean false"]),
    ("unknown-category", "defaults: {delete: deny}\n", ["defaults.delete: unknown key"]),
    ("bad-rule-action", "rules: [{name: a, action: block}]\n", ["rules[0].action: must be one of"]),
    ("missing-rule-action", "rules: [{name: a}]\n", ["rules[0]: missing required key 'action'"]),
    ("override-on-allow", "rules: [{name: a, action: allow, unless_override: true}]\n",
     ["rules[0].unless_override: applies only to 'action: deny'"]),
    ("bad-risk", "rules: [{name: a, action: deny, match: {min_risk_level: extreme}}]\n",
     ["rules[0].match.min_risk_level: must be one of low, medium, high, critical"]),
    ("tools-not-a-list", "rules: [{name: a, action: deny, match: {tools: write}}]\n",
     ["rules[0].match.tools: must be a non-empty list of strings"]),
    ("duplicate-rule-names", "rules: [{name: a, action: deny}, {name: a, action: allow}]\n",
     ["rules.yaml:1:35: rules[1].name: duplicate name 'a'"]),
    ("rules-not-a-list", "rules: {name: a}\n", ["rules: must be a list"]),
    ("bad-day", """
     maintenance_windows: [{name: w, days: [mon, funday], start: "01:00", end: "02:00"}]
     """, ["rules.yaml:2:45: maintenance_windows[0].days[1]: unknown day 'funday'"]),
    ("bad-zone", """
     maintenance_windows: [{name: w, start: "01:00", end: "02:00", timezone: Mars/Olympus}]
     """, ["maintenance_windows[0].timezone: unknown time zone", "Europe/Berlin"]),
    ("unquoted-time", "maintenance_windows: [{name: w, start: 22:00, end: \"06:00\"}]\n",
     ['maintenance_windows[0].start: write the time in quotes, e.g. "22:00"']),
    ("bad-time", "maintenance_windows: [{name: w, start: \"25:00\", end: \"06:00\"}]\n",
     ["maintenance_windows[0].start: must be a time"]),
    ("window-missing-end", "maintenance_windows: [{name: w, start: \"01:00\"}]\n",
     ["maintenance_windows[0]: missing required key 'end'"]),
    ("bad-window-risk",
     "maintenance_windows: [{name: w, start: \"01:00\", end: \"02:00\", risk_levels: [hgh]}]\n",
     ["maintenance_windows[0].risk_levels[0]: must be one of", "did you mean 'high'?"]),
    ("rate-key", "targets: {prod: {max_calls_per_minute: {writes: 5}}}\n",
     ["targets.prod.max_calls_per_minute.writes: unknown key; did you mean 'write'?"]),
    ("zero-limit", "defaults: {max_bulk_objects: 0}\n",
     ["defaults.max_bulk_objects: must be a whole number >= 1"]),
    ("flag-type", "targets: {prod: {dry_run: maybe}}\n", ["targets.prod.dry_run: must be true or false"]),
    ("protected-without-objects", "protected: [{name: p, targets: [prod]}]\n",
     ["protected[0]: needs 'vm_patterns'"]),
    ("duplicate-yaml-key", "defaults:\n  destructive: deny\n  destructive: allow\n",
     ["rules.yaml:3:3: the key 'destructive' appears twice in one mapping (first at line 2, column 3)"]),
    ("top-level-list", "- a\n", ["rules.yaml:1:1: (top level): must be a mapping"]),
    ("broken-yaml", "rules: [\n", ["rules.yaml:2:1: not valid YAML"]),
    ("yaml-error-names-the-file", "rules:\n  - {name: a\n", ["rules.yaml:3:1: not valid YAML"]),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in PARSE_ERRORS],
                         ids=[c[0] for c in PARSE_ERRORS])
def test_parse_errors_name_the_path_and_fix(text: str, expected: list[str]) -> None:
    with pytest.raises(ConfigProblems) as info:
        policy(text)
    message = info.value.message
    for fragment in expected:
        assert fragment in message
    assert "<unicode string>" not in message
    assert info.value.code == "config_error"


def test_parse_reports_every_problem_at_once() -> None:
    with pytest.raises(ConfigProblems) as info:
        policy("""
        defaults: {destructive: nope, dry_run: 1}
        rules: [{name: a, action: deny, match: {vm_pattern: [x]}}]
        """)
    assert len(info.value.problems) == 3
    assert [p.split(": ")[0] for p in info.value.problems] == ["rules.yaml:2:12", "rules.yaml:2:31",
                                                               "rules.yaml:3:41"]


@pytest.mark.parametrize("data", [None, {}])
def test_empty_file_means_builtin_strict_defaults(data: Any) -> None:
    parsed = parse_policy(data, "rules.yaml")
    assert parsed.builtin and "built-in strict defaults" in parsed.note
    assert evaluate(call(**DESTROY), parsed, NOW).allowed is False


def test_rules_example_is_valid_and_means_what_it_says() -> None:
    example = parse_policy_text((REPO / "rules.example.yaml").read_text(), "rules.example.yaml")
    assert [r.name for r in example.rules][:2] == ["freeze-during-incident", "interns-read-only"]
    scratch = call(target="lab", affected=(vm("tmp-1", "/dc/vm/scratch"),), **DESTROY)
    assert evaluate(scratch, example, NOW).rule == "rule:lab-scratch-vms"
    prod_delete = call(target="prod-vc2", affected=(vm("web-1"),), **{**DESTROY, "risk": Risk.MEDIUM})
    decision = evaluate(prod_delete, example, NOW)
    assert decision.allowed and decision.require_approval and decision.rule == "targets:prod-*"
    appliance = call(target="lab", affected=(vm("vcsa-01"),), risk=Risk.HIGH)
    assert evaluate(appliance, example, NOW).rule == "protected:management-plane"
    assert example.target_settings("prod-vc1").dry_run is True


# --------------------------------------------------------------------------- the live store

GOOD = complete_rules_text("defaults: {write: allow}  # padding\n")
SAME_SIZE = complete_rules_text("defaults: {write: deny}   # padding\n")


def test_store_without_file_uses_builtin_defaults(tmp_path: Path) -> None:
    store = PolicyStore(tmp_path / "rules.yaml")
    assert store.current().builtin
    assert decided(store, call(**DESTROY), NOW).rule == "defaults"
    shown = describe(store, [Target("dev", "h", "DEV")])
    assert shown["status"] == "builtin" and "no rules file" in shown["note"]


def test_store_notices_same_size_rewrite_with_old_mtime(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(GOOD)
    store = PolicyStore(path)
    assert decided(store, call(), NOW).allowed
    before = path.stat()
    path.write_text(SAME_SIZE)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    decision = decided(store, call(), NOW)
    assert (decision.allowed, decision.rule) == (False, "defaults")


def test_store_fails_closed_on_a_bad_reload_and_recovers(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    loads: list[RulesLoad] = []
    path.write_text(complete_rules_text("defaults: {destructive: allow}\n"))
    store = PolicyStore(path, on_reload=loads.append)
    assert decided(store, call(**DESTROY), NOW).allowed and store.broken is None
    path.write_text(complete_rules_text("defaults: {destructive: allow, dry_rn: true}\n"))
    for changes in ({}, READ, DESTROY):  # nothing falls back to the rules before
        refused = decided(store, call(**changes), NOW)
        assert (refused.allowed, refused.rule) == (False, "policy:error")
        assert str(path) in refused.reason and "dry_rn" in refused.reason
    with pytest.raises(PolicyUnavailable) as info:
        store.current()
    assert isinstance(info.value, ConfigError) and "dry_rn" in info.value.problems[0]
    broken = store.broken
    assert broken is not None and broken[0] == path.stat().st_mtime and "dry_rn" in broken[1]
    shown = describe(store, [])
    assert shown["status"] == "error" and shown["broken"] is True and "dry_rn" in shown["errors"][0]
    assert shown["broken_since"] and "no earlier rules" in shown["effect"]
    path.write_text(complete_rules_text("defaults: {destructive: allow, dry_run: true}\n"))
    recovered = decided(store, call(**DESTROY), NOW)
    assert (recovered.allowed, recovered.dry_run) == (True, True) and store.broken is None
    assert [(load.policy is not None, bool(load.problems), load.first, load.recovered) for load in loads] == [
        (True, False, True, False), (False, True, False, False), (True, False, False, True)]
    assert loads[1].previous is loads[0].policy and loads[1].sha256 is not None


def test_store_state_says_broken_and_since_when(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(complete_rules_text(""))
    store = PolicyStore(path)
    assert store.state() == {"status": "ok", "file": str(path)}
    path.write_text("defaults: [\n")
    os.utime(path, (1_800_000_000, 1_800_000_000))
    state = store.state()
    assert (state["status"], state["since"]) == ("broken", "2027-01-15T08:00:00+00:00")
    assert f"{path}:2:1: not valid YAML" in state["error"]


def test_store_broken_since_stays_across_broken_edits(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("defaults: [\n")
    store = PolicyStore(path)
    os.utime(path, (1_700_000_000, 1_700_000_000))
    assert store.snapshot()[0] is None
    path.write_text("defaults: [[\n")
    assert store.snapshot()[0] is None
    broken = store.broken
    assert broken is not None and broken[0] == 1_700_000_000 and "rules.yaml:2" in broken[1]


@pytest.mark.parametrize("setup", ["directory", "not-utf8", "yaml", "cut"])
def test_store_without_good_rules_fails_closed_reads_included(tmp_path: Path, setup: str) -> None:
    path = tmp_path / "rules.yaml"
    if setup == "directory":
        path.mkdir()
    elif setup == "not-utf8":
        path.write_bytes(b"defaults: {write: \xff}\n")
    elif setup == "yaml":
        path.write_text("defaults: [\n")
    else:
        path.write_text("defaults: {read: allow}\nprotected:\n")
    store = PolicyStore(path)
    with pytest.raises(PolicyUnavailable):
        store.current()
    for changes in ({}, READ, DESTROY):
        refused = decided(store, call(**changes), NOW)
        assert (refused.allowed, refused.rule) == (False, "policy:error")
    assert store.snapshot()[0] is None and "unusable" in (store.snapshot()[1] or "")
    assert "denied until it is fixed" in describe(store, [])["effect"] and store.broken is not None


EXAMPLE = (REPO / "rules.example.yaml").read_text()


def example_cuts() -> list[int]:
    """Offsets where rules.example.yaml, cut at a section boundary, would end: before each top-level
    key, and right after each one's ``key:`` line."""
    cuts, offset = [], 0
    for line in EXAMPLE.splitlines(keepends=True):
        if re.match(r"^[a-z_]+:", line):
            cuts += [offset, offset + len(line)]
        offset += len(line)
    return cuts


@pytest.mark.parametrize("cut", example_cuts())
def test_a_rules_file_cut_at_a_section_boundary_never_loses_a_gate(tmp_path: Path, cut: int) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(EXAMPLE)
    store = PolicyStore(path)
    appliance = call(target="lab", affected=(vm("vcsa-01"),), **DESTROY)
    prod_delete = call(target="prod-vc2", affected=(vm("web-1"),), **{**DESTROY, "risk": Risk.MEDIUM})
    assert decided(store, appliance, NOW).rule == "protected:management-plane"
    assert decided(store, prod_delete, NOW).require_approval
    path.write_text(EXAMPLE[:cut])
    with pytest.raises(PolicyUnavailable) as info:
        store.current()
    assert re.search(r"missing section|has no value|holds no section", str(info.value.problems))
    assert decided(store, appliance, NOW).rule == "policy:error"
    assert decided(store, prod_delete, NOW).rule == "policy:error"


SECTION_CASES: list[tuple[str, Any, list[str]]] = [
    ("complete", {name: [] for name in SECTIONS}, []),
    ("empty-file", None, ["rules.yaml: the file holds no section"]),
    ("no-mapping", {}, ["rules.yaml: the file holds no section"]),
    ("one-missing", {name: [] for name in SECTIONS if name != "rules"}, ["missing section 'rules'"]),
    ("cut-after-key", {**{name: [] for name in SECTIONS}, "protected": None},
     ["protected: has no value (was the file cut off after 'protected:'?); write 'protected: []'"]),
    ("not-a-mapping", ["a"], []),  # parse_policy names that problem
]


@pytest.mark.parametrize(("data", "expected"), [c[1:] for c in SECTION_CASES],
                         ids=[c[0] for c in SECTION_CASES])
def test_section_problems(data: Any, expected: list[str]) -> None:
    problems = section_problems(data, "rules.yaml")
    assert len(problems) == len(expected)
    assert all(want in got for want, got in zip(expected, problems, strict=True))


def test_the_decision_never_raises_on_policy_engine_errors(tmp_path: Path) -> None:
    store = PolicyStore(tmp_path / "rules.yaml")
    naive = datetime(2026, 3, 4, 12, 0)
    write = decided(store, call(), naive)
    assert (write.allowed, write.rule) == (False, "policy:error")
    assert "policy engine failed" in write.reason
    assert not decided(store, call(**READ), naive).allowed  # fail closed: rules filter reads too


def test_store_describe_shows_effective_policy_per_target(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text((REPO / "rules.example.yaml").read_text())
    targets = [Target("prod-vc1", "h", "P", tags=("env:prod",)), Target("lab", "h", "L")]
    shown = describe(PolicyStore(path), targets)
    assert shown["status"] == "ok"
    prod, lab = shown["targets"]["prod-vc1"], shown["targets"]["lab"]
    assert prod["destructive"] == "allow" and prod["set_by"]["destructive"] == "targets:prod-*"
    assert prod["dry_run"] is True and prod["set_by"]["dry_run"] == "targets:prod-vc1"
    assert "databases-need-override" in prod["rules"] and "databases-need-override" not in lab["rules"]
    assert prod["maintenance_windows"] == ["prod-weeknights", "prod-weekend"]
    assert lab["max_bulk_objects"] is None and lab["maintenance_windows"] == []
    assert shown["defaults"]["destructive"] == "deny"


def test_store_target_limits_are_the_strict_builtins_while_broken(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(complete_rules_text(
        "targets: {prod: {max_bulk_objects: 2, max_calls_per_minute: {write: 5}}}\n"))
    store = PolicyStore(path)
    limits = store.target_limits("prod")
    assert (limits.max_bulk_objects, limits.max_calls_per_minute["write"]) == (2, 5)
    path.write_text(complete_rules_text("targets: {prod: {max_bulk_objects: two}}\n"))
    limits = store.target_limits("prod")  # broken by an edit: the rules before do not stay
    assert (limits.max_bulk_objects, limits.rate_limit(Category.WRITE)) == (20, 30)
    fresh = PolicyStore(path)  # broken at start: the built-in strict values too
    assert (fresh.target_limits("prod").max_bulk_objects, fresh.target_limits("prod").rate_limit(
        Category.WRITE)) == (20, 30)
