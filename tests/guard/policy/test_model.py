"""gateway.guard.policy.model: how rules, protected entries, windows and target layers match plain facts."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, time
from types import MappingProxyType
from typing import Any

import pytest

from gateway.config import Target
from gateway.guard.policy.model import (
    ALL_DAYS,
    BUILTIN_DEFAULTS,
    OBJECT_FIELDS,
    Action,
    CallFacts,
    ConfirmBy,
    Decision,
    MaintenanceWindow,
    Match,
    Policy,
    Protected,
    Rule,
    TargetOverride,
    glob_fits,
)
from gateway.vocabulary import AffectedObject, Category, Risk

#: a Wednesday
WED_NOON = datetime(2026, 3, 4, 12, 0, tzinfo=UTC)


def vm(name: str, moid: str = "vm-1", folder: str | None = None, pool: str | None = None) -> AffectedObject:
    return AffectedObject("vm", name, moid, folder, pool)


def facts(**changes: Any) -> CallFacts:
    base = CallFacts(tool="power_off_vm", category=Category.WRITE, risk=Risk.MEDIUM, target="prod-1",
                     target_tags=("prod", "eu"), affected=(vm("web-1"),), caller="ci-bot", role="operator")
    return replace(base, **changes)


def match(**fields: tuple[str, ...]) -> Match:
    return Match(MappingProxyType(fields))


# --------------------------------------------------------------------------- the call and the answer


@pytest.mark.parametrize(("declared", "listed", "count"), [(0, 0, 0), (0, 2, 2), (5, 2, 5), (1, 3, 3)])
def test_call_count_is_never_fewer_than_the_objects_listed(declared: int, listed: int, count: int) -> None:
    call = facts(object_count=declared, affected=tuple(vm(f"v{i}", f"vm-{i}") for i in range(listed)))
    assert call.count == count


def test_decision_to_dict_turns_tuples_into_lists() -> None:
    decision = Decision(True, "ok", "rule:x", overridden=("a", "b"), approver_roles=("lead",))
    out = decision.to_dict()
    assert out["overridden"] == ["a", "b"]
    assert out["approver_roles"] == ["lead"]
    assert out["allowed"] is True and out["rule"] == "rule:x" and out["confirm_by"] == "tool"


# --------------------------------------------------------------------------- globs


@pytest.mark.parametrize(("value", "patterns", "fits"), [
    ("prod-1", ("prod-*",), True),
    ("PROD-1", ("prod-*",), True),
    ("prod-1", ("PROD-?",), True),
    ("prod-10", ("prod-?",), False),
    ("dev", ("prod-*", "dev"), True),
    ("dev", (), False),
    ("web-a", ("web-[ab]",), True),
    ("web-c", ("web-[ab]",), False),
    ("x", ("*",), True),
])
def test_glob_fits(value: str, patterns: tuple[str, ...], fits: bool) -> None:
    assert glob_fits(value, patterns) is fits


# --------------------------------------------------------------------------- match


@pytest.mark.parametrize(("fields", "fits"), [
    ({}, True),
    ({"targets": ("prod-*",)}, True),
    ({"targets": ("dev",)}, False),
    ({"target_tags": ("eu",)}, True),
    ({"target_tags": ("us",)}, False),
    ({"tools": ("write",)}, True),
    ({"tools": ("read", "destructive")}, False),
    ({"tools": ("power_*",)}, True),
    ({"tools": ("POWER_OFF_VM",)}, True),
    ({"tools": ("delete_vm",)}, False),
    ({"callers": ("ci-*",)}, True),
    ({"callers": ("alice",)}, False),
    ({"roles": ("operator",)}, True),
    ({"roles": ("admin",)}, False),
    ({"targets": ("prod-*",), "roles": ("admin",)}, False),
    ({"targets": ("prod-*",), "roles": ("admin", "operator")}, True),
])
def test_call_fields_are_anded_and_their_items_ored(fields: dict[str, tuple[str, ...]], fits: bool) -> None:
    assert match(**fields).fits_call(facts()) is fits


def test_a_category_name_in_tools_is_the_category_not_a_tool_glob() -> None:
    assert not match(tools=("write",)).fits_call(facts(tool="write", category=Category.READ))


@pytest.mark.parametrize(("least", "risk", "fits"), [
    (Risk.LOW, Risk.MEDIUM, True), (Risk.MEDIUM, Risk.MEDIUM, True), (Risk.HIGH, Risk.MEDIUM, False),
    (Risk.CRITICAL, Risk.CRITICAL, True), (Risk.CRITICAL, Risk.HIGH, False),
])
def test_min_risk_level(least: Risk, risk: Risk, fits: bool) -> None:
    assert Match(min_risk_level=least).fits_call(facts(risk=risk)) is fits


@pytest.mark.parametrize(("least", "declared", "fits"),
                         [(1, 0, True), (2, 0, False), (2, 2, True), (5, 4, False)])
def test_min_affected_objects_counts_the_call(least: int, declared: int, fits: bool) -> None:
    assert Match(min_affected_objects=least).fits_call(facts(object_count=declared)) is fits


TWO_VMS = (vm("web-1", "vm-1", "/DC0/vm/prod", "Resources"), vm("db-1", "vm-2", "/DC0/vm/db", "gold"))


@pytest.mark.parametrize(("fields", "any_fits", "every_fits"), [
    ({"vm_patterns": ("web-*",)}, True, False),
    ({"vm_patterns": ("*-1",)}, True, True),
    ({"vm_patterns": ("app-*",)}, False, False),
    ({"folders": ("/DC0/vm/prod",)}, True, False),
    ({"folders": ("/DC0/vm/*",)}, True, True),
    ({"resource_pools": ("gold",)}, True, False),
    ({"names": ("vm-2",)}, True, False),
    ({"names": ("vm-*",)}, True, True),
    ({"names": ("WEB-1", "db-1")}, True, True),
])
def test_object_fields_any_for_deny_every_for_allow(fields: dict[str, tuple[str, ...]], any_fits: bool,
                                                    every_fits: bool) -> None:
    call = facts(affected=TWO_VMS)
    assert match(**fields).fits(call, every_object=False) is any_fits
    assert match(**fields).fits(call, every_object=True) is every_fits


def test_vm_patterns_look_only_at_vms() -> None:
    host = AffectedObject("host", "web-host", "host-1")
    call = facts(affected=(host,))
    assert not match(vm_patterns=("web-*",)).fits(call, every_object=False)
    assert not match(vm_patterns=("web-*",)).fits(call, every_object=True)
    assert match(names=("web-*",)).fits(call, every_object=True)


def test_an_object_field_with_no_objects_never_fits() -> None:
    call = facts(affected=())
    assert not match(names=("*",)).fits(call, every_object=False)
    assert not match(names=("*",)).fits(call, every_object=True)


def test_an_object_without_a_folder_does_not_fit_a_folder_pattern() -> None:
    assert not match(folders=("*",)).fits(facts(affected=(vm("web-1"),)), every_object=False)


def test_a_failing_call_field_wins_over_fitting_objects() -> None:
    assert not match(targets=("dev",), names=("web-1",)).fits(facts(), every_object=False)


def test_object_fields_and_to_dict() -> None:
    m = Match(MappingProxyType({"targets": ("prod-*",), "folders": ("/x",), "names": ("a",)}), Risk.HIGH, 3)
    assert m.object_fields == ("folders", "names")
    assert m.to_dict() == {"targets": ["prod-*"], "folders": ["/x"], "names": ["a"], "min_risk_level": "high",
                           "min_affected_objects": 3}
    assert Match().to_dict() == {}
    assert set(OBJECT_FIELDS) == {"vm_patterns", "folders", "resource_pools", "names"}


# --------------------------------------------------------------------------- rules


@pytest.mark.parametrize(("action", "fits"), [(Action.DENY, True), (Action.REQUIRE_APPROVAL, True),
                                              (Action.ALLOW, False)])
def test_rules_judge_objects_by_their_action(action: Action, fits: bool) -> None:
    rule = Rule("r", action, match(vm_patterns=("web-*",)))
    assert rule.matches(facts(affected=TWO_VMS)) is fits


@pytest.mark.parametrize(("fields", "target", "applies"), [
    ({}, Target("prod-1", "h", "P"), True),
    ({"targets": ("prod-*",)}, Target("prod-1", "h", "P"), True),
    ({"targets": ("dev",)}, Target("prod-1", "h", "P"), False),
    ({"target_tags": ("eu",)}, Target("prod-1", "h", "P", tags=("eu",)), True),
    ({"target_tags": ("eu",)}, Target("prod-1", "h", "P"), False),
    ({"targets": ("prod-*",), "target_tags": ("us",)}, Target("prod-1", "h", "P", tags=("eu",)), False),
    ({"tools": ("delete_vm",)}, Target("prod-1", "h", "P"), True),
])
def test_rule_may_apply_to_a_target(fields: dict[str, tuple[str, ...]], target: Target,
                                    applies: bool) -> None:
    assert Rule("r", Action.DENY, match(**fields)).may_apply_to(target) is applies


def test_rule_to_dict_shows_only_the_keys_set() -> None:
    plain = Rule("r", Action.DENY, match(targets=("a",)), unless_override=True, reason="why")
    assert plain.to_dict() == {"name": "r", "action": "deny", "match": {"targets": ["a"]},
                               "unless_override": True, "reason": "why"}
    gated = Rule("g", Action.REQUIRE_APPROVAL, approvals_required=2, approver_roles=("lead",),
                 reason_required=True, confirm_by=ConfirmBy.ELICITATION)
    out = gated.to_dict()
    assert out["approvals_required"] == 2 and out["approver_roles"] == ["lead"]
    assert out["reason_required"] is True and out["confirm_by"] == "elicitation"


def test_rule_where_does_not_take_part_in_equality() -> None:
    assert Rule("r", Action.DENY, where="a:1:1") == Rule("r", Action.DENY, where="b:2:2")


# --------------------------------------------------------------------------- protected


@pytest.mark.parametrize(("entry", "call", "covers"), [
    (Protected("p"), facts(category=Category.DESTRUCTIVE), True),
    (Protected("p"), facts(category=Category.WRITE), False),
    (Protected("p"), facts(category=Category.READ), False),
    (Protected("p", min_risk_level=Risk.HIGH), facts(risk=Risk.HIGH), True),
    (Protected("p", min_risk_level=Risk.HIGH), facts(risk=Risk.MEDIUM), False),
    (Protected("p", min_risk_level=Risk.LOW), facts(category=Category.READ, risk=Risk.HIGH), False),
    (Protected("p", targets=("dev",)), facts(category=Category.DESTRUCTIVE), False),
    (Protected("p", targets=("PROD-*",)), facts(category=Category.DESTRUCTIVE), True),
])
def test_protected_covers(entry: Protected, call: CallFacts, covers: bool) -> None:
    assert entry.covers(call) is covers


@pytest.mark.parametrize(("entry", "obj", "protects"), [
    (Protected("p", vm_patterns=("db-*",)), vm("db-1"), True),
    (Protected("p", vm_patterns=("db-*",)), vm("web-1"), False),
    (Protected("p", vm_patterns=("db-*",)), AffectedObject("host", "db-host", "host-1"), False),
    (Protected("p", names=("datastore1",)), AffectedObject("datastore", "datastore1", "ds-1"), True),
    (Protected("p", names=("ds-1",)), AffectedObject("datastore", "datastore1", "ds-1"), True),
    (Protected("p", names=("ds-1",), types=("vm",)), AffectedObject("datastore", "x", "ds-1"), False),
    (Protected("p", names=("ds-*",), types=("Datastore",)), AffectedObject("datastore", "x", "ds-1"), True),
    (Protected("p"), vm("db-1"), False),
])
def test_protected_protects(entry: Protected, obj: AffectedObject, protects: bool) -> None:
    assert entry.protects(obj) is protects


def test_protected_to_dict() -> None:
    out = Protected("p", vm_patterns=("db-*",), min_risk_level=Risk.HIGH, reason="crown jewels").to_dict()
    assert out == {"name": "p", "vm_patterns": ["db-*"], "names": [], "types": [], "targets": [],
                   "min_risk_level": "high", "reason": "crown jewels"}
    assert Protected("q").to_dict()["min_risk_level"] is None


# --------------------------------------------------------------------------- maintenance windows


NIGHT = MaintenanceWindow("night", time(22, 0), time(6, 0))
OFFICE = MaintenanceWindow("office", time(9, 0), time(17, 0), days=frozenset({0, 1, 2, 3, 4}))
ALL_DAY = MaintenanceWindow("all-day", time(0, 0), time(0, 0), days=frozenset({2}))


@pytest.mark.parametrize(("window", "now", "open_"), [
    (OFFICE, WED_NOON, True),
    (OFFICE, datetime(2026, 3, 4, 9, 0, tzinfo=UTC), True),
    (OFFICE, datetime(2026, 3, 4, 17, 0, tzinfo=UTC), False),
    (OFFICE, datetime(2026, 3, 7, 12, 0, tzinfo=UTC), False),  # a Saturday
    (NIGHT, datetime(2026, 3, 4, 23, 0, tzinfo=UTC), True),
    (NIGHT, datetime(2026, 3, 5, 5, 59, tzinfo=UTC), True),
    (NIGHT, datetime(2026, 3, 5, 6, 0, tzinfo=UTC), False),
    (NIGHT, WED_NOON, False),
    (ALL_DAY, datetime(2026, 3, 4, 0, 0, tzinfo=UTC), True),
    (ALL_DAY, datetime(2026, 3, 4, 23, 59, tzinfo=UTC), True),
    (ALL_DAY, datetime(2026, 3, 5, 0, 0, tzinfo=UTC), False),
    (ALL_DAY, datetime(2026, 3, 3, 23, 59, tzinfo=UTC), False),
])
def test_window_is_open(window: MaintenanceWindow, now: datetime, open_: bool) -> None:
    assert window.is_open(now) is open_


def test_a_wrapping_window_stays_open_past_midnight_into_an_unlisted_day() -> None:
    friday_night = MaintenanceWindow("fri", time(22, 0), time(2, 0), days=frozenset({4}))
    assert friday_night.is_open(datetime(2026, 3, 7, 1, 0, tzinfo=UTC))  # Saturday 01:00
    assert not friday_night.is_open(datetime(2026, 3, 7, 23, 0, tzinfo=UTC))


def test_window_times_are_read_in_its_time_zone() -> None:
    berlin = MaintenanceWindow("b", time(9, 0), time(10, 0), timezone="Europe/Berlin")
    assert berlin.is_open(datetime(2026, 3, 4, 8, 30, tzinfo=UTC))  # 09:30 in Berlin (CET)
    assert not berlin.is_open(datetime(2026, 3, 4, 9, 30, tzinfo=UTC))


@pytest.mark.parametrize(("window", "now", "opening"), [
    (OFFICE, WED_NOON, datetime(2026, 3, 5, 9, 0, tzinfo=UTC)),
    (OFFICE, datetime(2026, 3, 6, 18, 0, tzinfo=UTC), datetime(2026, 3, 9, 9, 0, tzinfo=UTC)),
    (NIGHT, WED_NOON, datetime(2026, 3, 4, 22, 0, tzinfo=UTC)),
    (NIGHT, datetime(2026, 3, 4, 22, 0, tzinfo=UTC), datetime(2026, 3, 5, 22, 0, tzinfo=UTC)),
    (ALL_DAY, WED_NOON, datetime(2026, 3, 11, 0, 0, tzinfo=UTC)),
])
def test_next_opening(window: MaintenanceWindow, now: datetime, opening: datetime) -> None:
    assert window.next_opening(now) == opening


@pytest.mark.parametrize(("window", "text"), [
    (NIGHT, "every day 22:00-06:00 UTC"),
    (OFFICE, "mon,tue,wed,thu,fri 09:00-17:00 UTC"),
    (MaintenanceWindow("s", time(1, 5), time(2, 0), "Europe/Berlin", frozenset({6, 5})),
     "sat,sun 01:05-02:00 Europe/Berlin"),
])
def test_window_describe(window: MaintenanceWindow, text: str) -> None:
    assert window.describe() == text


@pytest.mark.parametrize(("risk", "target", "applies"), [
    (Risk.HIGH, "prod-1", True), (Risk.CRITICAL, "prod-1", True), (Risk.MEDIUM, "prod-1", False),
    (Risk.HIGH, "dev", False),
])
def test_window_applies_to_its_risks_and_targets(risk: Risk, target: str, applies: bool) -> None:
    assert replace(NIGHT, targets=("prod-*",)).applies(target, risk) is applies


def test_a_window_without_targets_applies_everywhere() -> None:
    assert NIGHT.applies("anything", Risk.HIGH)


def test_window_to_dict_orders_risks_by_rank() -> None:
    window = replace(NIGHT, risk_levels=frozenset({Risk.CRITICAL, Risk.LOW, Risk.HIGH}))
    out = window.to_dict()
    assert out["risk_levels"] == ["low", "high", "critical"]
    assert out["days"] == ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
    assert out["start"] == "22:00" and out["end"] == "06:00" and out["schedule"] == NIGHT.describe()
    assert frozenset(range(7)) == ALL_DAYS


# --------------------------------------------------------------------------- per-target settings


def layered() -> Policy:
    return Policy(
        "rules.yaml",
        defaults=MappingProxyType({**BUILTIN_DEFAULTS, "write": Action.REQUIRE_APPROVAL}),
        targets=(
            TargetOverride("prod-1", MappingProxyType({"dry_run": True, "max_bulk_objects": 3})),
            TargetOverride("prod-*", MappingProxyType({"dry_run": False, "max_bulk_objects": 5,
                                                       "max_calls_per_minute.write": 7})),
            TargetOverride("*", MappingProxyType({"destructive": Action.ALLOW})),
        ),
    )


def test_builtin_settings_are_strict() -> None:
    settings = Policy("rules.yaml").target_settings("any")
    assert settings.categories == {Category.READ: Action.ALLOW, Category.WRITE: Action.ALLOW,
                                   Category.DESTRUCTIVE: Action.DENY}
    assert settings.auto_snapshot_before_destroy
    assert not settings.dry_run and not settings.require_web_approval
    assert settings.max_bulk_objects == 20
    assert settings.rate_limit(Category.WRITE) == 30
    assert settings.rate_limit(Category.DESTRUCTIVE) == 10
    assert settings.rate_limit(Category.READ) is None
    assert settings.target_rate_limit(Category.WRITE) is None
    assert settings.confirm_by is ConfirmBy.TOOL
    assert settings.approvals_required == 1 and settings.approver_roles == () and not settings.reason_required


def test_an_exact_entry_wins_over_globs_whatever_the_file_order() -> None:
    settings = layered().target_settings("prod-1")
    assert settings.dry_run is True
    assert settings.max_bulk_objects == 3
    assert settings.origins["dry_run"] == "targets:prod-1"
    assert settings.origins["max_calls_per_minute.write"] == "targets:prod-*"
    assert settings.origins["destructive"] == "targets:*"
    assert settings.origins["write"] == "defaults"
    assert settings.rate_limit(Category.WRITE) == 7


def test_globs_layer_in_file_order() -> None:
    settings = layered().target_settings("prod-2")
    assert settings.dry_run is False and settings.max_bulk_objects == 5
    assert settings.categories[Category.DESTRUCTIVE] is Action.ALLOW
    assert settings.categories[Category.WRITE] is Action.REQUIRE_APPROVAL


def test_target_names_match_their_entries_case_insensitively() -> None:
    assert layered().target_settings("PROD-1").max_bulk_objects == 3


def test_default_settings_ignore_target_entries() -> None:
    settings = layered().default_settings()
    assert settings.target == ""
    assert settings.categories[Category.DESTRUCTIVE] is Action.DENY
    assert set(settings.origins.values()) == {"defaults"}


def test_target_policy_to_dict() -> None:
    out = layered().target_settings("prod-1").to_dict()
    assert out["read"] == "allow" and out["write"] == "require_approval" and out["destructive"] == "allow"
    assert out["max_calls_per_minute"] == {"read": None, "write": 7, "destructive": 10}
    assert out["target_max_calls_per_minute"] == {"read": None, "write": None, "destructive": None}
    assert out["set_by"]["max_bulk_objects"] == "targets:prod-1"
    assert out["approver_roles"] == [] and out["confirm_by"] == "tool"


def test_target_override_label() -> None:
    assert TargetOverride("lab-*", MappingProxyType({})).label == "targets:lab-*"
