"""gateway.guard.policy.parse: strict reading of rules files, each problem with its position and its fix."""

from __future__ import annotations

import re
from datetime import time

import pytest

from gateway.config import ConfigProblems
from gateway.guard.policy.model import Action, ConfirmBy
from gateway.guard.policy.parse import (
    SECTIONS,
    parse_policy,
    parse_policy_text,
    parse_rules_file,
    section_problems,
)
from gateway.vocabulary import Category, Risk

COMPLETE = "defaults: {}\nprotected: []\nrules: []\ntargets: {}\nmaintenance_windows: []\n"


def problems_of(text: str) -> list[str]:
    with pytest.raises(ConfigProblems) as raised:
        parse_policy_text(text, "r.yaml")
    return raised.value.problems


def only_problem(text: str) -> str:
    problems = problems_of(text)
    assert len(problems) == 1, problems
    return problems[0]


# --------------------------------------------------------------------------- good files


def test_an_empty_file_gives_the_builtin_defaults() -> None:
    for text in ("", "{}"):
        policy = parse_policy_text(text, "r.yaml")
        assert policy.builtin
        assert policy.note == "r.yaml is empty: the built-in strict defaults apply"


def test_a_complete_file_with_empty_sections() -> None:
    policy = parse_rules_file(COMPLETE.encode(), "r.yaml")
    assert not policy.builtin
    assert policy.rules == () and policy.protected == () and policy.targets == ()
    assert policy.target_settings("x").categories[Category.DESTRUCTIVE] is Action.DENY


def test_defaults_replace_only_what_they_set() -> None:
    policy = parse_policy_text("defaults: {destructive: allow, max_calls_per_minute: {write: 5}}\n", "r.yaml")
    settings = policy.default_settings()
    assert settings.categories[Category.DESTRUCTIVE] is Action.ALLOW
    assert settings.rate_limit(Category.WRITE) == 5
    assert settings.rate_limit(Category.DESTRUCTIVE) == 10


def test_a_null_limit_means_none() -> None:
    policy = parse_policy_text("defaults: {max_bulk_objects: null, max_calls_per_minute: {write: null}}\n",
                               "r.yaml")
    assert policy.default_settings().max_bulk_objects is None
    assert policy.default_settings().rate_limit(Category.WRITE) is None


def test_a_rule_with_every_key() -> None:
    policy = parse_policy_text(
        "rules:\n- name: gate\n  action: require_approval\n  reason: prod\n  approvals_required: 2\n"
        "  approver_roles: [lead]\n  reason_required: true\n  confirm_by: either\n"
        "  match: {targets: [prod-*], tools: [write], min_risk_level: high, min_affected_objects: 2}\n",
        "r.yaml")
    (rule,) = policy.rules
    assert rule.name == "gate" and rule.action is Action.REQUIRE_APPROVAL and rule.reason == "prod"
    assert (rule.approvals_required, rule.approver_roles, rule.reason_required) == (2, ("lead",), True)
    assert rule.confirm_by is ConfirmBy.EITHER
    assert rule.match.fields == {"targets": ("prod-*",), "tools": ("write",)}
    assert rule.match.min_risk_level is Risk.HIGH and rule.match.min_affected_objects == 2
    assert rule.where == "r.yaml:2:3"


def test_rules_keep_their_order() -> None:
    policy = parse_policy_text("rules:\n- {name: b, action: deny}\n- {name: a, action: allow}\n", "r.yaml")
    assert [r.name for r in policy.rules] == ["b", "a"]


def test_a_window_with_its_defaults() -> None:
    policy = parse_policy_text("maintenance_windows:\n- {name: w, start: '22:00', end: '06:30'}\n", "r.yaml")
    (window,) = policy.maintenance_windows
    assert (window.start, window.end, window.timezone) == (time(22, 0), time(6, 30), "UTC")
    assert window.risk_levels == {Risk.HIGH, Risk.CRITICAL}
    assert len(window.days) == 7


def test_a_window_with_days_risks_and_zone() -> None:
    policy = parse_policy_text(
        "maintenance_windows:\n- {name: w, start: '1:05', end: '02:00', timezone: Europe/Berlin, "
        "days: [Sat, sun], risk_levels: [medium]}\n", "r.yaml")
    (window,) = policy.maintenance_windows
    assert window.start == time(1, 5) and window.timezone == "Europe/Berlin"
    assert window.days == {5, 6} and window.risk_levels == {Risk.MEDIUM}


def test_protected_and_targets() -> None:
    policy = parse_policy_text(
        "protected:\n- {name: p, names: [ds-1], types: [datastore], targets: [prod-*], reason: r}\n"
        "targets:\n  prod-*: {dry_run: true}\n  prod-1: {write: deny}\n", "r.yaml")
    (entry,) = policy.protected
    assert (entry.names, entry.types, entry.targets, entry.reason) == (
        ("ds-1",), ("datastore",), ("prod-*",), "r")
    assert [t.pattern for t in policy.targets] == ["prod-*", "prod-1"]
    assert policy.target_settings("prod-1").dry_run
    assert policy.target_settings("prod-1").categories[Category.WRITE] is Action.DENY


def test_yaml_booleans_are_booleans() -> None:
    assert parse_policy_text("defaults: {dry_run: true}\n", "r.yaml").default_settings().dry_run


def test_refs_note_every_name_the_file_uses() -> None:
    policy = parse_policy_text(
        "rules:\n- name: a\n  action: require_approval\n  approver_roles: [lead]\n"
        "  match: {targets: [prod-*], tools: [delete_vm], roles: [op]}\n"
        "targets:\n  lab-*: {read: allow}\n"
        "protected:\n- {name: p, vm_patterns: [x], targets: [t1]}\n"
        "maintenance_windows:\n- {name: w, start: '01:00', end: '02:00', targets: [t2]}\n", "r.yaml")
    refs = {(r.kind, r.value, r.path) for r in policy.refs}
    assert refs == {
        ("target", "prod-*", "rules[0].match.targets[0]"),
        ("tool", "delete_vm", "rules[0].match.tools[0]"),
        ("role", "op", "rules[0].match.roles[0]"),
        ("role", "lead", "rules[0].approver_roles[0]"),
        ("target", "lab-*", "targets.lab-*"),
        ("target", "t1", "protected[0].targets[0]"),
        ("target", "t2", "maintenance_windows[0].targets[0]"),
    }
    assert all(r.glob and r.fold_case for r in policy.refs)
    where = {r.value: r.where for r in policy.refs}
    assert where["lab-*"] == "r.yaml:7:3"
    assert where["delete_vm"] == "r.yaml:5:38"


def test_a_tool_ref_after_a_category_name_keeps_its_own_index() -> None:
    policy = parse_policy_text("rules:\n- name: a\n  action: deny\n  match: {tools: [read, nosuchtool]}\n",
                               "r.yaml")
    (ref,) = policy.refs
    assert ref.path == "rules[0].match.tools[1]"
    assert ref.where == "r.yaml:4:25"


def test_category_names_in_tools_are_not_tool_refs() -> None:
    text = "rules:\n- {name: a, action: deny, match: {tools: [read, write, destructive]}}\n"
    policy = parse_policy_text(text, "r.yaml")
    assert policy.refs == ()


def test_parse_policy_takes_plain_values() -> None:
    policy = parse_policy({"rules": [{"name": "a", "action": "deny"}]}, "plain")
    assert policy.rules[0].name == "a" and policy.rules[0].where == "plain"


# --------------------------------------------------------------------------- problems


#: (file text, the problem after its ``file:line:column: ``)
ONE_PROBLEM = [
    ("defaults: {write: alow}\n",
     "defaults.write: must be one of allow, deny, require_approval; did you mean 'allow'?; got str 'alow'"),
    ("defaults: {max_bulk_objects: 0}\n",
     "defaults.max_bulk_objects: must be a whole number >= 1, or null for no limit; got int 0"),
    ("defaults: {max_bulk_objects: true}\n",
     "defaults.max_bulk_objects: must be a whole number >= 1, or null for no limit; got boolean true (YAML "
     "reads unquoted yes/no/on/off/true/false as booleans)"),
    ("defaults: {dry_run: 'yes'}\n", "defaults.dry_run: must be true or false, got str 'yes'"),
    ("defaults: {approvals_required: 11}\n",
     "defaults.approvals_required: must be a whole number of distinct approvers from 1 to 10, got int 11"),
    ("defaults: {approvals_required: 0}\n",
     "defaults.approvals_required: must be a whole number of distinct approvers from 1 to 10, got int 0"),
    ("defaults: {confirm_by: elicit}\n",
     "defaults.confirm_by: must be one of tool, elicitation, either; did you mean 'elicitation'?; "
     "got str 'elicit'"),
    ("defaults: {read: null}\n",
     "defaults.read: must be one of allow, deny, require_approval; got nothing (null)"),
    ("rules:\n- {name: a, action: deny}\n- {name: a, action: allow}\n",
     "rules[1].name: duplicate name 'a'; each entry needs its own name (decisions and audit rows cite it)"),
    ("rules:\n- name: a\n", "rules[0]: missing required key 'action'"),
    ("rules:\n- {name: a, action: maybe}\n",
     "rules[0].action: must be one of allow, deny, require_approval; got str 'maybe'"),
    ("rules:\n- name: a\n  action: allow\n  approvals_required: 2\n",
     "rules[0].approvals_required: applies only to 'action: require_approval'; remove it or make the rule "
     "require an approval"),
    ("rules:\n- name: a\n  action: require_approval\n  unless_override: true\n",
     "rules[0].unless_override: applies only to 'action: deny'; remove it or make it a deny"),
    ("rules:\n- name: a\n  action: deny\n  match: {min_affected_objects: 0}\n",
     "rules[0].match.min_affected_objects: must be a whole number >= 1 (the call affects at least that many "
     "objects), got int 0"),
    ("rules:\n- name: ''\n  action: deny\n", "rules[0].name: must be a non-empty string, got str ''"),
    ("rules:\n- name: a\n  action: deny\n  reason: 5\n",
     "rules[0].reason: must be a non-empty string, got int 5"),
    ("protected:\n- name: p\n",
     "protected[0]: needs 'vm_patterns' (VM names) or 'names' (names or moids of any object type)"),
    ("maintenance_windows:\n- name: w\n  start: 22:00\n  end: '06:00'\n",
     'maintenance_windows[0].start: write the time in quotes, e.g. "22:00" (YAML read the unquoted time as '
     "the number 1320)"),
    ("maintenance_windows:\n- {name: w, start: '24:00', end: '06:00'}\n",
     'maintenance_windows[0].start: must be a time "HH:MM" between "00:00" and "23:59", got str \'24:00\''),
    ("maintenance_windows:\n- {name: w, start: '10:60', end: '06:00'}\n",
     'maintenance_windows[0].start: must be a time "HH:MM" between "00:00" and "23:59", got str \'10:60\''),
    ("maintenance_windows:\n- {name: w, start: '01:00', end: '02:00', timezone: Mars/Base}\n",
     "maintenance_windows[0].timezone: unknown time zone str 'Mars/Base'; use an IANA name such as "
     "'Europe/Berlin' or 'UTC'"),
    ("maintenance_windows:\n- {name: w, start: '01:00', end: '02:00', days: [mon, thurs]}\n",
     "maintenance_windows[0].days[1]: unknown day 'thurs'; did you mean 'thu'?; use mon, tue, wed, thu, fri, "
     "sat, sun"),
    ("maintenance_windows:\n- {name: w, start: '01:00', end: '02:00', risk_levels: [hihg]}\n",
     "maintenance_windows[0].risk_levels[0]: must be one of low, medium, high, critical; did you mean "
     "'high'?; got str 'hihg'"),
    ("maintenance_windows:\n- {name: w, start: '01:00'}\n",
     "maintenance_windows[0]: missing required key 'end'"),
    ("targets: {'': {}}\n", "targets.: a target name or glob must be a non-empty string (quote it)"),
]


@pytest.mark.parametrize(("text", "problem"), ONE_PROBLEM)
def test_one_problem(text: str, problem: str) -> None:
    where, said = only_problem(text).split(": ", 1)
    assert said == problem
    assert re.fullmatch(r"r\.yaml:\d+:\d+", where)


@pytest.mark.parametrize(("text", "where"), [
    ("rules:\n- name: a\n  action: deny\n  reason: 5\n", "r.yaml:4:3"),
    ("rules:\n- name: a\n", "r.yaml:2:3"),
    ("defaults:\n  dry_run: 3\n", "r.yaml:2:3"),
    ("defaults:\n  max_calls_per_minute:\n    write: 0\n", "r.yaml:3:5"),
    ("maintenance_windows:\n- name: w\n  start: '01:00'\n  end: '02:00'\n  days:\n  - mon\n  - thurs\n",
     "r.yaml:7:5"),
    ("bogus: 1\n", "r.yaml:1:1"),
])
def test_a_problem_names_the_line_and_column_of_its_entry(text: str, where: str) -> None:
    assert only_problem(text).startswith(f"{where}: ")


@pytest.mark.parametrize(("text", "start"), [
    ("defaults: []\n", "r.yaml:1:1: defaults: must be a mapping of keys to values, got "),
    ("rules: {a: 1}\n", "r.yaml:1:1: rules: must be a list ('- ' items), got "),
    ("targets: []\n", "r.yaml:1:1: targets: must map target names or globs to settings, got "),
    ("- a\n", "r.yaml:1:1: (top level): must be a mapping of keys to values, got "),
    ("rules:\n- {name: a, action: deny, match: {targets: []}}\n",
     'r.yaml:2:35: rules[0].match.targets: must be a non-empty list of strings, e.g. ["prod-*"], got '),
    ("rules:\n- {name: a, action: deny, match: {targets: [1]}}\n",
     'r.yaml:2:35: rules[0].match.targets: must be a non-empty list of strings, e.g. ["prod-*"], got '),
])
def test_one_problem_about_a_shape(text: str, start: str) -> None:
    assert only_problem(text).startswith(start)


@pytest.mark.parametrize(("text", "key", "hint"), [
    ("bogus: 1\n", "bogus", ""),
    ("rule: []\n", "rule", "; did you mean 'rules'?"),
    ("defaults: {dryrun: true}\n", "defaults.dryrun", "; did you mean 'dry_run'?"),
    ("defaults: {max_calls_per_minute: {reed: 3}}\n", "defaults.max_calls_per_minute.reed",
     "; did you mean 'read'?"),
    ("rules:\n- {name: a, action: deny, match: {vm_pattern: [x]}}\n", "rules[0].match.vm_pattern",
     "; did you mean 'vm_patterns'?"),
    ("rules:\n- {name: a, action: deny, reasons: x}\n", "rules[0].reasons", "; did you mean 'reason'?"),
    ("protected:\n- {name: p, vm_pattern: [x], names: [y]}\n", "protected[0].vm_pattern",
     "; did you mean 'vm_patterns'?"),
])
def test_unknown_keys_suggest_the_nearest_and_list_the_allowed(text: str, key: str, hint: str) -> None:
    problem = only_problem(text)
    assert f": {key}: unknown key{hint}; allowed keys: " in problem


def test_every_problem_in_a_file_is_listed() -> None:
    problems = problems_of("defaults: {write: nope, dry_run: 3}\nrules:\n- name: a\nbogus: 1\n")
    assert sorted(p.split(": ")[1] for p in problems) == ["bogus", "defaults.dry_run", "defaults.write",
                                                          "rules[0]"]


# --------------------------------------------------------------------------- whole files


def rules_file_problems(raw: bytes) -> list[str]:
    with pytest.raises(ConfigProblems) as raised:
        parse_rules_file(raw, "r.yaml")
    return raised.value.problems


def test_a_file_that_is_not_utf8() -> None:
    assert rules_file_problems(b"\xff\xfe") == ["r.yaml: not UTF-8 text (byte 0); save it as UTF-8"]


def test_an_empty_rules_file_is_refused() -> None:
    (problem,) = rules_file_problems(b"")
    assert problem.startswith("r.yaml: the file holds no section (was it cut off?); write every section "
                              "(defaults, protected, rules, targets, maintenance_windows)")


@pytest.mark.parametrize("missing", list(SECTIONS))
def test_each_missing_section_is_named(missing: str) -> None:
    text = "".join(f"{name}: {empty}\n" for name, empty in SECTIONS.items() if name != missing)
    (problem,) = rules_file_problems(text.encode())
    assert problem == (f"r.yaml:1:1: (top level): missing section '{missing}'; every section must be "
                       f"present (write '{missing}: {SECTIONS[missing]}' for none), so that a file cut short "
                       "is refused instead of read as fewer rules")


@pytest.mark.parametrize("cut", list(SECTIONS))
def test_a_section_without_a_value_is_named(cut: str) -> None:
    text = "".join(f"{name}:\n" if name == cut else f"{name}: {empty}\n" for name, empty in SECTIONS.items())
    (problem,) = rules_file_problems(text.encode())
    assert problem.endswith(f": {cut}: has no value (was the file cut off after '{cut}:'?); write "
                            f"'{cut}: {SECTIONS[cut]}' for none")


def test_a_repeated_key_is_reported_with_the_other_problems() -> None:
    problems = rules_file_problems((COMPLETE + "rules: []\ndefaults: {write: x}\n").encode())
    assert problems[0] == ("r.yaml:6:1: the key 'rules' appears twice in one mapping (first at line 3, "
                           "column 1); keep only one")
    assert len(problems) == 2


def test_invalid_yaml_is_one_problem_with_its_position() -> None:
    (problem,) = rules_file_problems(b"rules: [\n")
    assert problem.startswith("r.yaml:2:1: not valid YAML: ")


def test_section_problems_is_pure_and_quiet_on_non_mappings() -> None:
    assert section_problems(["a"], "r.yaml") == []
    assert section_problems({name: [] for name in SECTIONS}, "r.yaml") == []
    assert len(section_problems(None, "r.yaml")) == 1
    assert len(section_problems({}, "r.yaml")) == 1
    assert [p.split("'")[1] for p in section_problems({"rules": []}, "r.yaml")] == [
        "defaults", "protected", "targets", "maintenance_windows"]


def test_sections_list_every_section_with_its_empty_form() -> None:
    assert dict(SECTIONS) == {"defaults": "{}", "protected": "[]", "rules": "[]", "targets": "{}",
                              "maintenance_windows": "[]"}


def test_a_shape_problem_reads_the_same_from_a_file_as_from_plain_values() -> None:
    with pytest.raises(ConfigProblems) as plain:
        parse_policy({"defaults": []}, "r.yaml")
    assert only_problem("defaults: []\n").endswith(plain.value.problems[0].split(": ", 1)[1])
